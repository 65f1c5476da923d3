"""Which NUMA node `gputune plan` binds to: the GPU's node for the GPU target, the node with the most
free memory for vLLM's CPU backend, and unbound where binding changes nothing.

The hosts are synthetic trees (tests/hosttree.py) of two NUMA nodes; the GPU is the real H200's
``nvidia-smi -q -x`` (tests/fixtures/nvidia-smi/, bus 0000:00:06.0) placed on node 1 through its PCI
device's ``numa_node`` in sysfs, as the kernel reports it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosttree import HostTree
from tuner.models import load_profiles
from tuner.plan import Plan, PlanRequest, compute_plan, gather_facts, render_text
from tuner.vllm_cli import VllmHelp

XML = Path(__file__).parent / "fixtures" / "nvidia-smi" / "h200-idle-gen1.xml"
BUS = "0000:00:06.0"  # <pci_bus_id>00000000:00:06.0</pci_bus_id> of that capture
GiB_KIB = 1 << 20
HELP = VllmHelp(None, None, {}, "test: no vLLM")


def two_node_host(
    tmp_path: Path, *, gpu_node: int | None, free0_gib: int = 100, free1_gib: int = 20, gpu: bool = True
) -> HostTree:
    """Node 0 has the most free memory; the GPU (when any) sits on ``gpu_node`` (None: sysfs says -1)."""
    t = HostTree(tmp_path / "host")
    t.meminfo(256 * GiB_KIB, (free0_gib + free1_gib) * GiB_KIB)
    t.numa_node(0, "0-15", 128 * GiB_KIB, free0_gib * GiB_KIB)
    t.numa_node(1, "16-31", 128 * GiB_KIB, free1_gib * GiB_KIB)
    if gpu:
        t.write("/nvidia-smi.xml", XML.read_text())
        t.nvidia_gpu(
            BUS,
            numa_node=-1 if gpu_node is None else gpu_node,
            local_cpulist="16-31" if gpu_node == 1 else None,
        )
    return t


def plan_on(t: HostTree, model: str = "qwen72b-gptq", **kw: object) -> Plan:
    req = PlanRequest(model, **kw)  # type: ignore[arg-type]
    with t.host() as host:
        facts = gather_facts(req, host, vllm=HELP)
    return compute_plan(req, load_profiles()[model], facts)


def test_gpu_plan_binds_to_the_gpus_node_not_the_node_with_most_free_memory(tmp_path: Path) -> None:
    plan = plan_on(two_node_host(tmp_path, gpu_node=1))
    assert plan.target == "gpu" and plan.device["name"] == "NVIDIA H200"
    assert plan.numa_node == 1  # node 0 has five times the free memory: the GPU's node wins
    assert BUS in plan.numa_reason and "node 1" in plan.numa_reason
    assert f"/sys/bus/pci/devices/{BUS}/numa_node" in plan.numa_reason  # the XML has no node: sysfs told
    assert "numa: 1 (" in render_text(plan)


def test_gpu_node_0_is_kept_even_when_node_1_has_more_free_memory(tmp_path: Path) -> None:
    plan = plan_on(two_node_host(tmp_path, gpu_node=0, free0_gib=5, free1_gib=120))
    assert plan.numa_node == 0 and "node 0" in plan.numa_reason


def test_cpu_plan_binds_to_the_node_with_most_free_memory(tmp_path: Path) -> None:
    plan = plan_on(two_node_host(tmp_path, gpu_node=None, gpu=False), model="qwen2.5-7b")
    assert plan.target == "cpu"
    assert plan.numa_node == 0
    assert "most memory available" in plan.numa_reason and "100.00 GiB" in plan.numa_reason
    swapped = plan_on(
        two_node_host(tmp_path / "b", gpu_node=None, gpu=False, free0_gib=10, free1_gib=90),
        model="qwen2.5-7b",
    )
    assert swapped.numa_node == 1


def test_gpu_without_a_reported_node_falls_back_to_the_node_with_most_free_memory(tmp_path: Path) -> None:
    plan = plan_on(two_node_host(tmp_path, gpu_node=None, free0_gib=10, free1_gib=90))
    assert plan.target == "gpu"
    assert plan.numa_node == 1
    assert "no GPU reports its NUMA node" in plan.numa_reason and "most memory available" in plan.numa_reason


def test_one_node_host_with_a_gpu_launches_unbound_and_says_why(tmp_path: Path) -> None:
    t = HostTree(tmp_path / "host")
    t.meminfo(64 * GiB_KIB, 60 * GiB_KIB)
    t.numa_node(0, "0-7", 64 * GiB_KIB, 60 * GiB_KIB)
    t.write("/nvidia-smi.xml", XML.read_text())
    t.nvidia_gpu(BUS, numa_node=0)
    plan = plan_on(t)
    assert plan.target == "gpu" and plan.numa_node is None
    assert "one NUMA node" in plan.numa_reason and "unbound" in plan.numa_reason


@pytest.mark.parametrize("gpu_mem", ["48GiB"])
def test_gpu_mem_on_a_gpu_host_binds_to_that_hosts_gpu_node(tmp_path: Path, gpu_mem: str) -> None:
    plan = plan_on(two_node_host(tmp_path, gpu_node=1), gpu_mem=gpu_mem)
    assert plan.device["source"] == "--gpu-mem"
    assert plan.numa_node == 1 and "--gpu-mem" in plan.numa_reason

"""Host probes and checks on trees captured from real machines.

- ../shared/fixtures/hosts/h200-vm and cpu-vm: an H200 VM and a machine like the development one;
- prometheus/procfs' fixtures.ttar: /proc and /sys from bare-metal machines (cpufreq governors,
  two NUMA nodes, SATA disks under device-mapper, /proc/self/{limits,mountinfo,status}, /proc/net/tcp).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tuner.checks import load_defs, run_checks, select
from tuner.findings import Finding, Status
from tuner.host import Host
from tuner.probes import Facts
from tuner.probes.cpu import CpuFacts
from tuner.probes.memory import UNLIMITED, MemoryFacts, parse_limits, parse_mountinfo
from tuner.probes.net import NetFacts
from tuner.probes.numa import NumaFacts
from tuner.probes.swap import Media, trace_device

HOST_AREAS = ["numa", "cpu", "swap", "memory", "vllm"]


def findings(host: Host) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in run_checks(Facts(host), select(load_defs(), HOST_AREAS, [])):
        out.setdefault(f.id, []).append(f)
    return out


@pytest.fixture(scope="session")
def procfs_root(shared_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prometheus/procfs' captured trees, unpacked once with the shared ttar tool."""
    tool = shared_fixtures.parent / "tools" / "ttar.py"
    spec = importlib.util.spec_from_file_location("ttar", tool)
    assert spec is not None and spec.loader is not None
    ttar = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ttar)
    dest = tmp_path_factory.mktemp("procfs")
    ttar.unpack(str(shared_fixtures / "third_party" / "prometheus-procfs" / "fixtures.ttar"), str(dest))
    return dest / "fixtures"


# -- h200-vm -------------------------------------------------------------------------------------
def test_h200_vm_host_checks(shared_fixtures: Path) -> None:
    host = Host.at(shared_fixtures / "hosts" / "h200-vm")
    got = findings(host)
    [cpu] = got["cpu.governor"]
    assert cpu.status is Status.SKIP and "no cpufreq" in cpu.summary
    assert cpu.evidence["model"] == "Intel(R) Xeon(R) Processor"
    assert cpu.evidence["logical_cpus"] == 16
    assert {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"} <= set(cpu.evidence["isa"])
    [numa] = got["numa.affinity"]
    assert numa.status is Status.SKIP and "one NUMA node (node 0, CPUs 0-15)" in numa.summary
    [gpu] = numa.evidence["gpus"]
    assert gpu["pci_bus_id"] == "0000:00:06.0"
    assert gpu["numa_node"] is None  # numa_node reads -1 and NVML says NotSupported
    assert gpu["local_cpus"] == "0-15"
    [swap] = got["swap.device"]
    assert swap.status is Status.PASS and swap.summary == "no swap; RAM: 125.4 GiB of 125.9 GiB available"
    [memlock] = got["memory.memlock"]
    assert memlock.status is Status.PASS and memlock.evidence["soft"] == UNLIMITED
    assert got["memory.thp"][0].evidence["enabled"] == "madvise"
    assert got["memory.swappiness"][0].evidence["overcommit_memory"] == 1
    assert got["vllm.exposed"][0].status is Status.SKIP  # no /proc/net/tcp captured


def test_h200_vm_numa_facts_for_launch(shared_fixtures: Path) -> None:
    nf: NumaFacts = Facts(Host.at(shared_fixtures / "hosts" / "h200-vm")).get("numa")
    assert [n.id for n in nf.nodes] == [0]
    assert nf.nodes[0].cpus == tuple(range(16))
    assert nf.nodes[0].mem_total == 4550128 * 1024
    assert nf.balancing == 0
    assert nf.gpu_nodes == {"0000:00:06.0": None}
    assert not nf.multi_node


# -- cpu-vm --------------------------------------------------------------------------------------
def test_cpu_vm_host_checks(shared_fixtures: Path) -> None:
    got = findings(Host.at(shared_fixtures / "hosts" / "cpu-vm"))
    [cpu] = got["cpu.governor"]
    assert cpu.status is Status.SKIP and "no cpufreq" in cpu.summary
    assert cpu.evidence["model"] == "AMD EPYC" and "avx512f" not in cpu.evidence["isa"]
    [swap] = got["swap.device"]
    assert swap.status is Status.PASS and swap.summary.startswith("no swap;")
    assert swap.evidence["swaps"] == []
    [numa] = got["numa.affinity"]
    assert numa.status is Status.SKIP and numa.evidence["gpus"] == []
    [memlock] = got["memory.memlock"]
    assert memlock.status is Status.PASS and memlock.evidence["soft"] == 8192 * 1024
    assert all(f.status is not Status.ERROR for fs in got.values() for f in fs)


# -- prometheus/procfs trees ---------------------------------------------------------------------------
def test_procfs_powersave_governor_with_intel_pstate_warns(procfs_root: Path) -> None:
    host = Host.at(procfs_root)
    cf: CpuFacts = Facts(host).get("cpu")
    assert cf.governors() == {"powersave": "0-1"}
    assert cf.drivers() == ("intel_pstate",)
    assert cf.logical_cpus == 8 and cf.model == "Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz"
    [f] = findings(host)["cpu.governor"]
    assert f.status is Status.WARN and "powersave on CPUs 0-1" in f.summary


def test_procfs_swap_on_device_mapper_is_traced_to_its_slaves(procfs_root: Path) -> None:
    [f] = findings(Host.at(procfs_root))["swap.device"]
    assert f.evidence["filename"] == "/dev/dm-2" and f.evidence["device"] == "dm-2"
    assert sorted(d["name"] for d in f.evidence["disks"]) == ["sdd", "sde"]
    # the capture keeps no queue/rotational for sdd/sde: the kind cannot be told, which is said
    assert f.status is Status.WARN and f.evidence["media"] == "unknown"
    assert f.remediation is not None and "lsblk" in (f.remediation.command or "")


def test_procfs_rotational_sata_disk_is_classified_rotational(procfs_root: Path) -> None:
    disks, trace = trace_device(Host.at(procfs_root), "sda")
    assert [d.media for d in disks] == [Media.ROTATIONAL]
    assert disks[0].rotational is True and trace


def test_procfs_numa_nodes_without_cpulists_and_the_process_affinity(procfs_root: Path) -> None:
    host = Host.at(procfs_root)
    nf: NumaFacts = Facts(host).get("numa")
    assert [n.id for n in nf.nodes] == [1, 2]
    assert nf.process_cpus == tuple(range(8)) and nf.process_cpus_source == "/proc/self/status"
    [f] = findings(host)["numa.affinity"]
    assert f.status is Status.SKIP and "not reported" in f.summary


def test_procfs_limits_mounts_and_listeners(procfs_root: Path) -> None:
    host = Host.at(procfs_root)
    limits = parse_limits((procfs_root / "proc/self/limits").read_text())
    assert limits["Max open files"] == (2048, 4096)
    assert limits["Max locked memory"] == (UNLIMITED, UNLIMITED)
    mounts = parse_mountinfo((procfs_root / "proc/self/mountinfo").read_text())
    root = next(m for m in mounts if m.mount_point == "/")
    assert (root.device, root.fstype, root.major, root.minor) == ("/dev/sda1", "ext4", 8, 1)
    mf: MemoryFacts = Facts(host).get("memory")
    assert set(mf.rdma_devices) >= {"mlx4_0", "mlx5_0"}
    assert mf.memlock_soft == UNLIMITED
    net: NetFacts = Facts(host).get("net")
    assert {(ln.address, ln.port) for ln in net.listeners} == {("10.0.0.5", 22), ("0.0.0.0", 22)}
    got = findings(host)
    assert got["vllm.exposed"][0].status is Status.PASS
    assert got["memory.memlock"][0].status is Status.PASS
    assert all(f.status is not Status.ERROR for fs in got.values() for f in fs)

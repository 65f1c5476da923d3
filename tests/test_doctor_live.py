"""The doctor and the host probes on this very machine: real /sys and /proc, real numactl, real sockets."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.host import Host
from tuner.probes import Facts
from tuner.probes.cpu import CpuFacts
from tuner.probes.memory import MemoryFacts, read_mounts
from tuner.probes.numa import NumaFacts, format_cpulist, numactl_argv
from tuner.probes.swap import Media, _device_of_file, trace_device

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def doctor(*args: str, prefix: list[str] | None = None, env: dict[str, str] | None = None) -> dict:
    r = subprocess.run(
        [*(prefix or []), sys.executable, "-m", "tuner", "doctor", "--format", "json", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**ENV, **(env or {})},
        timeout=120,
    )
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    doc["_rc"] = r.returncode
    return doc


def test_live_doctor_exits_0_with_valid_json() -> None:
    # vllm.exposed is left out: a server another test session started here would be its business
    doc = doctor("--skip", "vllm.exposed")
    assert doc["_rc"] == 0
    assert doc["schema_version"] == 1 and doc["host"]["live"] is True and doc["host"]["source"] == "live"
    assert doc["host"]["kernel"] == os.uname().release
    by_id = {c["id"]: c for c in doc["checks"]}
    assert {"numa.affinity", "cpu.governor", "swap.device", "memory.shm"} <= set(by_id)
    assert "vllm.exposed" not in by_id
    assert not [c for c in doc["checks"] if c["status"] == "fail"]
    # this machine: one NUMA node, no cpufreq, no swap (see ../shared/fixtures/hosts/cpu-vm)
    assert by_id["numa.affinity"]["status"] == "skip"
    assert by_id["cpu.governor"]["status"] == "skip"
    assert by_id["swap.device"]["status"] == "pass"
    # no GPU here: every GPU check says skip, with the reason
    gpu_checks = [c for c in doc["checks"] if c["id"].startswith(("pcie.", "driver.", "gpu."))]
    assert gpu_checks and all(c["status"] == "skip" and c["summary"] for c in gpu_checks)


def test_live_numa_facts_match_the_kernel() -> None:
    nf: NumaFacts = Facts(Host.live_host()).get("numa")
    assert nf.process_cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert nf.process_cpus_source == "sched_getaffinity"
    assert nf.nodes and set().union(*(set(n.cpus) for n in nf.nodes)) >= set(os.sched_getaffinity(0))
    assert all(n.mem_total and n.mem_free is not None for n in nf.nodes)


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_numactl_binding_argv_runs_and_the_doctor_sees_the_binding() -> None:
    nf: NumaFacts = Facts(Host.live_host()).get("numa")
    node = nf.nodes[0]
    r = subprocess.run(
        [*numactl_argv(node.id), sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == list(node.cpus)
    # bound to a single CPU, the doctor reports exactly that affinity
    doc = doctor("--only", "numa.affinity", prefix=["numactl", f"--physcpubind={node.cpus[0]}"])
    [f] = doc["checks"]
    assert f["evidence"]["process_cpus"] == format_cpulist([node.cpus[0]])


def test_live_block_devices_are_classified_from_real_sysfs() -> None:
    host = Host.live_host()
    for name in os.listdir("/sys/block"):
        disks, trace = trace_device(host, name)
        assert disks and trace, name
        if name.startswith("zram"):
            assert disks[0].media is Media.ZRAM
        if name.startswith("vd"):
            assert disks[0].media is Media.VIRTIO
        if name.startswith("nvme"):
            assert disks[0].media is Media.NVME


@pytest.mark.skipif(shutil.which("findmnt") is None, reason="findmnt is not installed")
def test_a_file_is_traced_to_the_block_device_findmnt_names() -> None:
    host = Host.live_host()
    mounts, _ = read_mounts(host)
    name, trace = _device_of_file(host, str(REPO / "pyproject.toml"), mounts)
    source = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", "-T", str(REPO / "pyproject.toml")], capture_output=True, text=True
    ).stdout.strip()
    if not source.startswith("/dev/"):
        pytest.skip(f"the checkout is not on a block device ({source})")
    assert name == os.path.basename(os.path.realpath(source)), trace


def test_live_memory_facts_match_the_process() -> None:
    import resource

    mf: MemoryFacts = Facts(Host.live_host()).get("memory")
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert mf.memlock_soft == (-1 if soft == resource.RLIM_INFINITY else soft)
    st = os.statvfs("/dev/shm")
    assert mf.shm_size == st.f_blocks * st.f_frsize and mf.shm_source == "statvfs"
    assert mf.mem_total and mf.mem_available


def test_py_cpuinfo_runs_only_when_asked_on_the_live_host() -> None:
    plain: CpuFacts = Facts(Host.live_host()).get("cpu")
    assert plain.deep is None and plain.logical_cpus == os.cpu_count()
    deep: CpuFacts = Facts(Host.live_host(), cpu_deep=True).get("cpu")
    assert deep.deep is not None and deep.deep.get("arch")
    assert plain.flags <= deep.flags


# -- vllm.exposed: a process with a vLLM server's command line, listening on a real socket ----------------
SERVER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.fixture
def listener() -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(address: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, int]:
        p = subprocess.Popen(
            [sys.executable, "-c", SERVER, address, "-m", "vllm.entrypoints.openai.api_server", *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        procs.append(p)
        assert p.stdout is not None
        port = int(p.stdout.readline())
        return p.pid, port

    yield start
    for p in procs:
        p.kill()
        p.wait(timeout=10)


def _wait_listening(port: int) -> None:
    for _ in range(50):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def test_vllm_on_all_addresses_without_api_key_fails(listener) -> None:  # type: ignore[no-untyped-def]
    pid, port = listener("0.0.0.0", "--port", "8000")
    _wait_listening(port)
    doc = doctor("--only", "vllm.exposed", env={"VLLM_API_KEY": ""})
    mine = [c for c in doc["checks"] if c["subject"] == f"pid {pid}"]
    assert [c["status"] for c in mine] == ["fail"]
    assert f"0.0.0.0:{port}" in mine[0]["summary"]
    assert mine[0]["evidence"]["vllm_api_key_env"] is False
    assert doc["_rc"] == 1


def test_vllm_with_api_key_in_argv_or_environment_passes(listener) -> None:  # type: ignore[no-untyped-def]
    pid_arg, port_arg = listener("0.0.0.0", "--api-key", "s3cret")
    pid_env, port_env = listener("0.0.0.0", env={"VLLM_API_KEY": "s3cret"})
    _wait_listening(port_arg)
    _wait_listening(port_env)
    doc = doctor("--only", "vllm.exposed")
    by_subject = {c["subject"]: c for c in doc["checks"]}
    assert by_subject[f"pid {pid_arg}"]["status"] == "pass"
    assert by_subject[f"pid {pid_env}"]["status"] == "pass"
    assert "s3cret" not in json.dumps(doc)  # the key is redacted from the evidence


def test_vllm_on_loopback_only_is_not_exposed(listener) -> None:  # type: ignore[no-untyped-def]
    pid, port = listener("127.0.0.1")
    _wait_listening(port)
    doc = doctor("--only", "vllm.exposed")
    assert not [c for c in doc["checks"] if c["subject"] == f"pid {pid}"]
    exposed = {a for c in doc["checks"] for a in c["evidence"]["exposed_listeners"]}
    assert doc["checks"] and not any(a.endswith(f":{port}") for a in exposed)


def test_a_snapshot_of_this_machine_gives_the_same_host_findings(tmp_path: Path) -> None:
    snap = tmp_path / "snap.tar.gz"
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "snapshot", "-o", str(snap)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=ENV,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    areas = ["--only", "numa,cpu,swap,memory"]
    live = {(c["id"], c["subject"]): c["status"] for c in doctor(*areas)["checks"]}
    offline = {(c["id"], c["subject"]): c["status"] for c in doctor("--from", str(snap), *areas)["checks"]}
    assert offline == live

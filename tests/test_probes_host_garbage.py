"""Garbage, unreadable, missing and oddly shaped inputs never crash a host probe.

Every input file of the numa/cpu/swap/memory/net probes is replaced in turn by fuzzed bytes
(hypothesis), by a directory, or made unreadable through a Host that answers "permission
denied" (tests run as root, so chmod 000 would not deny anything). The probes must return
their records and the checks findings; at worst an ``error`` or ``skip`` finding with a reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hosttree import NVME_PATH, SATA_PATH, HostTree
from tuner.checks import load_defs, run_checks, select
from tuner.findings import Status
from tuner.host import Host, Reading, State
from tuner.probes import Facts

PROBES = ("numa", "cpu", "swap", "memory", "net")
AREAS = ["numa", "cpu", "swap", "memory", "vllm"]

INPUTS = [
    "/proc/meminfo",
    "/proc/swaps",
    "/proc/cpuinfo",
    "/proc/self/status",
    "/proc/self/mountinfo",
    "/proc/mounts",
    "/proc/self/limits",
    "/proc/self/cgroup",
    "/proc/net/tcp",
    "/proc/net/tcp6",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/vm/swappiness",
    "/proc/sys/vm/overcommit_memory",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
    "/sys/fs/cgroup/user.slice/memory.max",
    "/sys/devices/system/node/node0/cpulist",
    "/sys/devices/system/node/node1/meminfo",
    "/sys/devices/system/cpu/online",
    "/sys/devices/system/cpu/cpufreq/policy0/scaling_governor",
    "/sys/devices/system/cpu/cpufreq/policy1/affected_cpus",
    "/sys/devices/pci0000:81/0000:81:00.0/numa_node",
    "/sys/devices/pci0000:81/0000:81:00.0/local_cpulist",
    "/sys/devices/pci0000:81/0000:81:00.0/vendor",
    f"/sys/devices/{SATA_PATH}/block/sda/queue/rotational",
    f"/sys/devices/{NVME_PATH}/block/nvme0n1/nvme0n1p2/partition",
    "/sys/dev/block/259:2",
    "/sys/class/block/sda2",
]


def build(root: Path) -> HostTree:
    t = HostTree(root)
    t.meminfo(64 << 20, 40 << 20, swap_total_kib=8 << 20, swap_free_kib=8 << 20)
    t.cpuinfo("Test CPU", ["avx2", "avx512f"], count=4)
    t.cpus(4)
    t.cpufreq(range(2), "powersave")
    t.cpufreq(range(2, 4), "performance")
    t.numa_node(0, "0-1", 32 << 20, 10 << 20)
    t.numa_node(1, "2-3", 32 << 20, 20 << 20)
    t.nvidia_gpu("0000:81:00.0", numa_node=1, local_cpulist="2-3")
    t.self_status("0-3")
    t.sysctl("kernel.numa_balancing", 1)
    t.sysctl("vm.swappiness", 60)
    t.sysctl("vm.overcommit_memory", 0)
    t.write("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    t.write("/sys/kernel/mm/transparent_hugepage/defrag", "[always] madvise never\n")
    t.write("/proc/self/cgroup", "0::/user.slice\n")
    t.write("/sys/fs/cgroup/user.slice/memory.max", "8589934592\n")
    t.write(
        "/proc/self/limits",
        "Limit Soft Hard Units\nMax locked memory         65536                65536                bytes\n",
    )
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda2"])
    t.disk("nvme0n1", NVME_PATH, rotational=False, devno="259:0")
    t.partition("nvme0n1", f"{NVME_PATH}/block/nvme0n1", "nvme0n1p2", 2, devno="259:2")
    t.mountinfo(
        ("259:2", "/", "ext4", "/dev/nvme0n1p2", "rw"), ("0:30", "/dev/shm", "tmpfs", "tmpfs", "rw,size=64m")
    )
    t.write("/proc/mounts", "/dev/nvme0n1p2 / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw,size=65536k 0 0\n")
    t.swaps(("/dev/sda2", "partition", 4 << 20, 0, -2), ("/swapfile", "file", 4 << 20, 0, -3))
    t.write(
        "/proc/net/tcp",
        "  sl  local_address rem_address   st\n"
        "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0 4242 1 0\n",
    )
    t.write("/proc/net/tcp6", "  sl  local_address remote_address st\n")
    return t


def probe_all_and_check(host: Host) -> list[Status]:
    facts = Facts(host)
    for name in PROBES:
        facts.get(name)  # a probe must never raise for what it reads
    found = run_checks(facts, select(load_defs(), AREAS, []))
    for f in found:
        assert f.summary and isinstance(f.evidence, dict)
        if f.status is Status.ERROR:
            # a rule that broke on a probe's record is a bug, not the input's fault
            assert "the check broke" not in f.summary, f
    return [f.status for f in found]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> HostTree:
    return build(tmp_path_factory.mktemp("garbage") / "root")


def test_the_base_tree_exercises_every_check(tree: HostTree) -> None:
    statuses = probe_all_and_check(tree.host())
    # powersave CPUs, unbound process, SATA swap, small shm, cgroup limit, THP always, swappiness, open port
    assert Status.FAIL in statuses and Status.WARN in statuses


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(INPUTS), data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_fuzzed_input_files_never_crash_a_probe(tree: HostTree, path: str, data: bytes) -> None:
    real = tree.path(path)
    saved = real.read_bytes() if real.is_file() and not real.is_symlink() else None
    was_link = real.readlink() if real.is_symlink() else None
    try:
        if real.is_symlink():
            real.unlink()
        tree.write(path, data)
        probe_all_and_check(tree.host())
    finally:
        if real.exists() or real.is_symlink():
            real.unlink()
        if was_link is not None:
            real.symlink_to(was_link)
        elif saved is not None:
            real.write_bytes(saved)


@pytest.mark.parametrize("path", INPUTS)
def test_a_directory_where_a_file_is_expected_is_not_a_crash(tmp_path: Path, path: str) -> None:
    t = build(tmp_path / "root")
    real = t.path(path)
    if real.is_symlink() or real.is_file():
        real.unlink()
    elif real.is_dir():
        shutil.rmtree(real)
    real.mkdir(parents=True)
    (real / "x").write_text("1\n")
    probe_all_and_check(t.host())


class DenyingHost(Host):
    """A host root where some paths answer EACCES, as they do for a non-root user."""

    def __init__(self, root: Path, denied: tuple[str, ...]) -> None:
        super().__init__(root, live=False)
        self.denied = denied

    def _is_denied(self, hostpath: str) -> bool:
        return any(hostpath.startswith(d) for d in self.denied)

    def read_text(self, hostpath: str, limit: int = 4 << 20) -> Reading[str]:
        if self._is_denied(hostpath):
            return Reading.missing(State.DENIED, f"{hostpath}: Permission denied")
        return super().read_text(hostpath, limit)

    def listdir(self, hostpath: str) -> Reading[list[str]]:
        if self._is_denied(hostpath):
            return Reading.missing(State.DENIED, f"{hostpath}: Permission denied")
        return super().listdir(hostpath)


@pytest.mark.parametrize("denied", [(p,) for p in INPUTS] + [("/proc",), ("/sys",), ("/proc", "/sys")])
def test_unreadable_inputs_are_not_a_crash(tree: HostTree, denied: tuple[str, ...]) -> None:
    probe_all_and_check(DenyingHost(tree.root, denied))


def test_denied_cpufreq_is_a_skip_that_says_so(tree: HostTree) -> None:
    host = DenyingHost(tree.root, ("/sys/devices/system/cpu/cpufreq", "/sys/devices/system/cpu/cpu"))
    [f] = run_checks(Facts(host), select(load_defs(), ["cpu.governor"], []))
    assert f.status is Status.SKIP and "Permission denied" in f.summary


def test_denied_proc_swaps_is_a_skip_with_the_reason(tree: HostTree) -> None:
    [f] = run_checks(
        Facts(DenyingHost(tree.root, ("/proc/swaps",))), select(load_defs(), ["swap.device"], [])
    )
    assert f.status is Status.SKIP and "/proc/swaps" in f.summary


def test_huge_cpuinfo_is_read_up_to_its_limit(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    block = "processor\t: 0\nmodel name\t: Big\nflags\t\t: avx2\n\n"
    t.write("/proc/cpuinfo", block * (20 << 20 // len(block)))
    assert probe_all_and_check(t.host())

"""Host probes and checks on synthetic trees for the situations users hit (built with tests/hosttree.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosttree import NVME_PATH, SAS_PATH, SATA_PATH, VIRTIO_PATH, HostTree
from tuner.checks import load_defs, run_checks, select
from tuner.findings import Finding, Status
from tuner.gpu import GpuInfo, GpuInventory
from tuner.host import Host, State
from tuner.probes import Facts
from tuner.probes.numa import NumaFacts, launch_node, node_with_most_free_memory, numactl_argv
from tuner.probes.swap import Media


def run(host: Host, *ids: str, **options: object) -> list[Finding]:
    return run_checks(Facts(host, **options), select(load_defs(), list(ids), []))


def one(host: Host, check_id: str) -> Finding:
    found = run(host, check_id)
    assert len(found) == 1, found
    return found[0]


class FakeGpuFacts(Facts):
    """Facts whose GPU inventory is given (NVML cannot exist here); every other probe is real."""

    def __init__(self, host: Host, inventory: GpuInventory, **options: object) -> None:
        super().__init__(host, **options)
        self._inventory = inventory

    def get(self, name: str) -> object:
        if name == "gpu":
            return self._inventory
        return super().get(name)


def _gpu(bus: str, index: int = 0, numa_node: int | None = None) -> GpuInfo:
    return GpuInfo(
        index=index,
        name="NVIDIA GeForce RTX 3090",
        uuid=f"GPU-{index}",
        pci_bus_id=bus,
        memory_total=24 << 30,
        memory_used=1 << 30,
        memory_free=23 << 30,
        compute_capability=(8, 6),
        pcie=None,
        numa_node=numa_node,
    )


# -- NUMA --------------------------------------------------------------------------------------------
@pytest.fixture
def two_nodes(tmp_path: Path) -> HostTree:
    t = HostTree(tmp_path / "root")
    t.numa_node(0, "0-15", mem_total_kib=64 << 20, mem_free_kib=10 << 20)
    t.numa_node(1, "16-31", mem_total_kib=64 << 20, mem_free_kib=50 << 20)
    t.nvidia_gpu("0000:81:00.0", numa_node=1, local_cpulist="16-31")
    t.sysctl("kernel.numa_balancing", 0)
    return t


def test_gpu_on_node_1_of_two_nodes_is_found_through_sysfs_with_its_local_cpus(two_nodes: HostTree) -> None:
    two_nodes.self_status("0-31")
    nf: NumaFacts = Facts(two_nodes.host()).get("numa")
    assert [n.cpulist for n in nf.nodes] == ["0-15", "16-31"]
    assert nf.nodes[1].mem_free == 50 << 30
    assert nf.gpu_nodes == {"0000:81:00.0": 1}
    assert nf.gpus[0].local_cpulist == "16-31"
    assert nf.process_cpus == tuple(range(32))
    assert launch_node(nf) == 1
    assert numactl_argv(launch_node(nf) or 0) == ["numactl", "--cpunodebind=1", "--membind=1"]


def test_unbound_process_on_two_nodes_warns_with_the_numactl_binding_of_the_gpu_node(
    two_nodes: HostTree,
) -> None:
    two_nodes.self_status("0-31")
    f = one(two_nodes.host(), "numa.affinity")
    assert f.status is Status.WARN
    assert "node 1" in f.summary and "not bound" in f.summary
    assert f.remediation is not None and f.remediation.command is not None
    assert f.remediation.command.startswith("numactl --cpunodebind=1 --membind=1 ")
    assert f.evidence["launch_binding"] == "numactl --cpunodebind=1 --membind=1"
    assert f.evidence["process_cpus"] == "0-31"


def test_process_bound_to_the_gpu_node_passes(two_nodes: HostTree) -> None:
    two_nodes.self_status("16-31")
    assert one(two_nodes.host(), "numa.affinity").status is Status.PASS


def test_numa_balancing_on_while_bound_warns_to_turn_it_off(two_nodes: HostTree) -> None:
    two_nodes.self_status("16-23")
    two_nodes.sysctl("kernel.numa_balancing", 1)
    f = one(two_nodes.host(), "numa.affinity")
    assert f.status is Status.WARN
    assert f.remediation is not None and f.remediation.command == "sysctl -w kernel.numa_balancing=0"


def test_nvml_numa_node_wins_over_sysfs_minus_one(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.numa_node(0, "0-7")
    t.numa_node(1, "8-15")
    t.nvidia_gpu("0000:41:00.0", numa_node=-1)
    t.self_status("8-15")
    inv = GpuInventory(State.OK, gpus=(_gpu("0000:41:00.0", numa_node=1),), source="nvml")
    facts = FakeGpuFacts(t.host(), inv)
    nf: NumaFacts = facts.get("numa")
    assert nf.gpus[0].node == 1 and nf.gpus[0].node_source == "nvml"
    assert nf.gpus[0].name == "NVIDIA GeForce RTX 3090"
    [f] = run_checks(facts, select(load_defs(), ["numa.affinity"], []))
    assert f.status is Status.PASS and f.subject == "gpu0"


def test_gpu_numa_node_not_reported_on_two_nodes_is_a_skip_that_says_how_to_look(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.numa_node(0, "0-7")
    t.numa_node(1, "8-15")
    t.nvidia_gpu("0000:41:00.0", numa_node=-1)
    f = one(t.host(), "numa.affinity")
    assert f.status is Status.SKIP
    assert "does not report" in f.summary
    assert f.remediation is not None and f.remediation.command == "nvidia-smi topo -m"


def test_single_node_is_skipped_with_the_evidence_kept(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.numa_node(0, "0-3", mem_total_kib=8 << 20)
    t.nvidia_gpu("0000:00:06.0", numa_node=-1, local_cpulist="0-3")
    f = one(t.host(), "numa.affinity")
    assert f.status is Status.SKIP and "one NUMA node" in f.summary
    assert f.evidence["nodes"][0]["cpus"] == "0-3"
    assert f.evidence["gpus"][0]["pci_bus_id"] == "0000:00:06.0"


def test_two_nodes_without_gpu_name_the_node_with_most_free_memory(two_nodes: HostTree) -> None:
    import shutil

    shutil.rmtree(two_nodes.path("/sys/bus"))
    nf: NumaFacts = Facts(two_nodes.host()).get("numa")
    assert node_with_most_free_memory(nf) == 1
    f = one(two_nodes.host(), "numa.affinity")
    assert f.status is Status.SKIP and "node 1" in f.summary


# -- CPU governor ------------------------------------------------------------------------------------
@pytest.mark.parametrize("governor", ["powersave", "ondemand"])
def test_power_saving_governors_warn_with_cpupower_and_the_sysfs_alternative(
    tmp_path: Path, governor: str
) -> None:
    t = HostTree(tmp_path)
    t.cpus(4)
    t.cpufreq(range(4), governor, driver="acpi-cpufreq")
    f = one(t.host(), "cpu.governor")
    assert f.status is Status.WARN
    assert f"{governor} on CPUs 0-3" in f.summary
    assert f.remediation is not None
    assert f.remediation.command == "cpupower frequency-set -g performance"
    assert "tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor" in f.remediation.summary
    assert f.remediation.needs_root and f.remediation.persistent is False
    assert f.evidence["governors"] == {governor: "0-3"}
    assert f.evidence["drivers"] == ["acpi-cpufreq"]


def test_mixed_governors_name_each_group_of_cpus(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.cpus(8)
    t.cpufreq(range(4), "performance", driver="intel_pstate")
    t.cpufreq(range(4, 8), "powersave", driver="intel_pstate")
    t.write("/sys/devices/system/cpu/intel_pstate/status", "active\n")
    f = one(t.host(), "cpu.governor")
    assert f.status is Status.WARN
    assert "powersave on CPUs 4-7" in f.summary and "performance" not in f.summary.split("(")[0]
    assert "ramps up slower" in f.summary


def test_performance_governor_everywhere_passes(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.cpus(2)
    t.cpufreq(range(2), "performance", driver="amd-pstate-epp")
    assert one(t.host(), "cpu.governor").status is Status.PASS


def test_cpu_model_and_isa_flags_come_from_proc_cpuinfo(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.cpuinfo(
        "Intel(R) Xeon(R) Platinum 8480+", ["fpu", "avx2", "avx512f", "avx512_bf16", "amx_tile"], count=4
    )
    f = one(t.host(), "cpu.governor")
    assert f.status is Status.SKIP and "no cpufreq" in f.summary
    assert f.evidence["model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert f.evidence["logical_cpus"] == 4
    assert f.evidence["isa"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]
    assert f.evidence["amx"] is True


# -- swap --------------------------------------------------------------------------------------------
def _swap_tree(tmp_path: Path) -> HostTree:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 60 << 20, swap_total_kib=8 << 20, swap_free_kib=8 << 20)
    return t


def test_swap_partition_on_a_sata_ssd_fails(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda2"])
    t.swaps(("/dev/sda2", "partition", 8 << 20, 0, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.FAIL
    assert "SATA/SAS SSD" in f.summary
    assert f.evidence["media"] == "ssd" and f.evidence["disks"][0]["name"] == "sda"
    assert f.evidence["disks"][0]["transport"] == "ata"
    assert f.remediation is not None and f.remediation.command == "swapoff /dev/sda2"


def test_swap_on_a_rotational_disk_fails_as_the_slowest_kind(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("sdb", SAS_PATH, rotational=True, partitions=["sdb1"])
    t.swaps(("/dev/sdb1", "partition", 8 << 20, 1024, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.FAIL
    assert "rotational disk" in f.summary and "slowest" in f.summary


def test_swap_file_on_an_nvme_filesystem_passes(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("nvme0n1", NVME_PATH, rotational=False, devno="259:0")
    t.partition("nvme0n1", f"{NVME_PATH}/block/nvme0n1", "nvme0n1p2", 2, devno="259:2")
    t.mountinfo(("259:2", "/", "ext4", "/dev/nvme0n1p2", "rw"), ("0:22", "/dev/shm", "tmpfs", "tmpfs", "rw"))
    t.swaps(("/swapfile", "file", 16 << 20, 0, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.PASS
    assert f.evidence["device"] == "nvme0n1p2"
    assert f.evidence["media"] == "nvme"
    assert any("nvme0n1p2 is a partition of nvme0n1" in step for step in f.evidence["trace"])


def test_swap_file_traced_by_mount_source_when_mountinfo_has_no_device_number(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("sdc", SATA_PATH, rotational=True, partitions=["sdc1"])
    t.write("/proc/mounts", "/dev/sdc1 /data ext4 rw,relatime 0 0\n")
    t.swaps(("/data/swap\\040file", "file", 1 << 20, 0, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.FAIL and f.subject == "/data/swap file"


def test_zram_swap_passes_with_a_note(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.zram("zram0")
    t.swaps(("/dev/zram0", "partition", 4 << 20, 0, 100))
    f = one(t.host(), "swap.device")
    assert f.status is Status.PASS and "zram" in f.summary and "takes RAM" in f.summary


def test_swap_on_lvm_over_an_ssd_and_a_disk_is_as_slow_as_the_disk(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda3"])
    t.disk("sdb", SAS_PATH, rotational=True, partitions=["sdb1"])
    t.stacked("dm-1", ["sda3", "sdb1"], dm_name="vg0-swap")
    t.swaps(("/dev/mapper/vg0-swap", "partition", 8 << 20, 0, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.FAIL
    assert f.evidence["device"] == "dm-1"
    assert f.evidence["media"] == Media.ROTATIONAL.value
    assert sorted(d["name"] for d in f.evidence["disks"]) == ["sda", "sdb"]


def test_swap_on_a_virtio_disk_warns_that_the_medium_is_unknown(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.disk("vda", VIRTIO_PATH, rotational=True, partitions=["vda3"])
    t.swaps(("/dev/vda3", "partition", 2 << 20, 0, -2))
    f = one(t.host(), "swap.device")
    assert f.status is Status.WARN and "virtio" in f.summary


def test_each_swap_area_is_its_own_finding(tmp_path: Path) -> None:
    t = _swap_tree(tmp_path)
    t.zram("zram0")
    t.disk("sda", SATA_PATH, rotational=False, partitions=["sda2"])
    t.swaps(("/dev/zram0", "partition", 4 << 20, 0, 100), ("/dev/sda2", "partition", 8 << 20, 0, -2))
    found = run(t.host(), "swap.device")
    assert [(f.subject, f.status) for f in found] == [("/dev/zram0", Status.PASS), ("/dev/sda2", Status.FAIL)]


def test_no_swap_reports_the_ram_headroom(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20)
    t.swaps()
    f = one(t.host(), "swap.device")
    assert f.status is Status.PASS
    assert f.summary == "no swap; RAM: 48.0 GiB of 64.0 GiB available"


def test_no_swap_and_little_free_ram_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 2 << 20)
    t.swaps()
    f = one(t.host(), "swap.device")
    assert f.status is Status.WARN and "OOM killer" in f.summary


# -- memory ------------------------------------------------------------------------------------------
def test_docker_default_shm_of_64_mib_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20)
    t.mountinfo(("0:50", "/dev/shm", "tmpfs", "shm", "rw,size=65536k"))
    f = one(t.host(), "memory.shm")
    assert f.status is Status.WARN and "64.0 MiB" in f.summary
    assert f.remediation is not None and "--shm-size" in f.remediation.summary


def test_shm_without_size_option_is_half_of_ram(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20)
    t.write("/proc/mounts", "tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0\n")
    f = one(t.host(), "memory.shm")
    assert f.status is Status.PASS and f.evidence["size"] == 32 << 30


def test_limited_memlock_with_rdma_devices_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.write(
        "/proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max locked memory         8388608              8388608              bytes\n",
    )
    t.mkdir("/sys/class/infiniband/mlx5_0")
    f = one(t.host(), "memory.memlock")
    assert f.status is Status.WARN and "mlx5_0" in f.summary
    t2 = HostTree(tmp_path / "no-rdma")
    t2.write("/proc/self/limits", t.path("/proc/self/limits").read_text())
    assert one(t2.host(), "memory.memlock").status is Status.PASS


def test_cgroup_v2_limit_below_ram_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20)
    t.write("/proc/self/cgroup", "0::/system.slice/vllm.service\n")
    t.write("/sys/fs/cgroup/system.slice/vllm.service/memory.max", f"{16 << 30}\n")
    f = one(t.host(), "memory.cgroup")
    assert f.status is Status.WARN and "16.0 GiB of 64.0 GiB" in f.summary
    t.write("/sys/fs/cgroup/system.slice/vllm.service/memory.max", "max\n")
    assert one(t.host(), "memory.cgroup").status is Status.PASS


def test_cgroup_v1_container_limit_is_read_at_the_cgroup_root(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20)
    t.write("/proc/self/cgroup", "4:memory:/docker/abc\n0::/\n")
    t.write("/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{8 << 30}\n")
    f = one(t.host(), "memory.cgroup")
    assert f.status is Status.WARN and f.evidence["cgroup_version"] == 1


def test_thp_always_with_synchronous_defrag_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.write("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n")
    t.write("/sys/kernel/mm/transparent_hugepage/defrag", "[always] defer defer+madvise madvise never\n")
    assert one(t.host(), "memory.thp").status is Status.WARN
    t.write("/sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never\n")
    assert one(t.host(), "memory.thp").status is Status.PASS


def test_high_swappiness_with_swap_warns_and_strict_overcommit_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.meminfo(64 << 20, 48 << 20, swap_total_kib=8 << 20)
    t.sysctl("vm.swappiness", 60)
    t.sysctl("vm.overcommit_memory", 0)
    f = one(t.host(), "memory.swappiness")
    assert f.status is Status.WARN and f.remediation is not None
    assert f.remediation.command == "sysctl -w vm.swappiness=10"
    t.sysctl("vm.swappiness", 10)
    assert one(t.host(), "memory.swappiness").status is Status.PASS
    t.sysctl("vm.overcommit_memory", 2)
    assert one(t.host(), "memory.swappiness").status is Status.WARN


# -- vllm.exposed from a snapshot ---------------------------------------------------------------------
TCP_HEADER = (
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
)


def test_snapshot_listener_on_all_addresses_at_port_8000_warns(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.write(
        "/proc/net/tcp",
        TCP_HEADER
        + "   0: 00000000:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 4242 1 0 100 0\n"
        "   1: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0  0 4243 1 0 100 0\n",
    )
    f = one(t.host(), "vllm.exposed")
    assert f.status is Status.WARN and "0.0.0.0:8000" in f.summary
    assert f.remediation is not None and f.remediation.command == "ss -ltnp 'sport = :8000'"


def test_snapshot_with_only_loopback_listeners_passes(tmp_path: Path) -> None:
    t = HostTree(tmp_path)
    t.write(
        "/proc/net/tcp",
        TCP_HEADER + "   1: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 0 0 0 4243 1 0\n",
    )
    assert one(t.host(), "vllm.exposed").status is Status.PASS


def test_page_cache_counts_as_available_so_a_node_full_of_cached_model_files_is_not_full(
    tmp_path: Path,
) -> None:
    # After a model is read from disk its pages sit in the node's page cache: MemFree is small but
    # the kernel hands that memory out at once. Node 0 has less MemFree but far more clean cache.
    t = HostTree(tmp_path)
    for node, free_kib, file_kib in ((0, 4 << 20, 40 << 20), (1, 8 << 20, 1 << 20)):
        t.write(f"/sys/devices/system/node/node{node}/cpulist", f"{node * 4}-{node * 4 + 3}\n")
        t.write(
            f"/sys/devices/system/node/node{node}/meminfo",
            f"Node {node} MemTotal:       {64 << 20} kB\nNode {node} MemFree:        {free_kib} kB\n"
            f"Node {node} FilePages:      {file_kib} kB\nNode {node} Shmem:          {1 << 20} kB\n"
            f"Node {node} KReclaimable:   {1 << 19} kB\n",
        )
    nf = Facts(t.host()).get("numa")
    by_id = {n.id: n for n in nf.nodes}
    assert by_id[0].mem_free == (4 << 20) * 1024
    assert by_id[0].available == ((4 << 20) + (40 << 20) - (1 << 20) + (1 << 19)) * 1024
    assert by_id[1].available == ((8 << 20) + 0 + (1 << 19)) * 1024  # cache all shmem: nothing to reclaim
    assert node_with_most_free_memory(nf) == 0

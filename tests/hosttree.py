"""Build small synthetic host roots for tests: files at host paths, sysfs links, common devices.

A tree is a folder laid out like a snapshot (``proc/...``, ``sys/...``); ``tree.host()`` opens it
with :meth:`tuner.host.Host.at`. Helpers write what the probes read on real machines, using the
kernel's own formats and sysfs layout (device directories under ``/sys/devices``, class and bus
entries as relative symlinks to them)::

    t = HostTree(tmp_path)
    t.numa_node(0, "0-15"); t.numa_node(1, "16-31")
    t.nvidia_gpu("0000:81:00.0", numa_node=1, local_cpulist="16-31")
    t.swaps(("/dev/sda2", "partition", 8 << 20, 0, -2))
    t.disk("sda", SATA_PATH, rotational=False, partitions=("sda2",))
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tuner.host import Host

# Device paths under /sys/devices as real kernels lay them out.
NVME_PATH = "pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0"
SATA_PATH = "pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0"
SAS_PATH = "pci0000:00/0000:00:11.4/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:0/0:0:0:0"
VIRTIO_PATH = "pci0000:00/0000:00:02.0/virtio1"
VIRTUAL_PATH = "virtual"

MEMINFO = """MemTotal:       {total} kB
MemFree:        {free} kB
MemAvailable:   {available} kB
Buffers:           19548 kB
Cached:          1920080 kB
SwapCached:            0 kB
SwapTotal:      {swap_total} kB
SwapFree:       {swap_free} kB
"""


class HostTree:
    """A synthetic host root under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    # -- primitives --------------------------------------------------------------------------------
    def path(self, hostpath: str) -> Path:
        return self.root / hostpath.lstrip("/")

    def write(self, hostpath: str, text: str | bytes) -> Path:
        p = self.path(hostpath)
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        else:
            p.write_text(text)
        return p

    def mkdir(self, hostpath: str) -> Path:
        p = self.path(hostpath)
        p.mkdir(parents=True, exist_ok=True)
        return p

    def link(self, hostpath: str, target: str) -> Path:
        """A symlink at ``hostpath``; a target relative to the link, as sysfs writes them."""
        p = self.path(hostpath)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        os.symlink(target, p)
        return p

    def sys_link(self, hostpath: str, devices_path: str) -> Path:
        """Link ``hostpath`` (e.g. /sys/class/block/sda) to /sys/devices/<devices_path>, relatively."""
        link_dir = self.path(hostpath).parent
        target = os.path.relpath(self.path(f"/sys/devices/{devices_path}"), link_dir)
        return self.link(hostpath, target)

    def host(self) -> Host:
        return Host.at(self.root)

    # -- procfs ------------------------------------------------------------------------------------
    def meminfo(
        self, total_kib: int, available_kib: int, swap_total_kib: int = 0, swap_free_kib: int = 0
    ) -> None:
        self.write(
            "/proc/meminfo",
            MEMINFO.format(
                total=total_kib,
                free=available_kib,
                available=available_kib,
                swap_total=swap_total_kib,
                swap_free=swap_free_kib,
            ),
        )

    def swaps(self, *entries: tuple[str, str, int, int, int]) -> None:
        """/proc/swaps lines: (filename, "partition"|"file", size KiB, used KiB, priority)."""
        lines = ["Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority"]
        lines += [f"{name:<40}{kind}\t{size}\t{used}\t{prio}" for name, kind, size, used, prio in entries]
        self.write("/proc/swaps", "\n".join(lines) + "\n")

    def sysctl(self, name: str, value: str | int) -> None:
        """/proc/sys/<name with dots as slashes>: sysctl("vm.swappiness", 60)."""
        self.write("/proc/sys/" + name.replace(".", "/"), f"{value}\n")

    def self_status(self, cpus_allowed_list: str) -> None:
        self.write(
            "/proc/self/status",
            f"Name:\tpython3\nCpus_allowed:\tff\nCpus_allowed_list:\t{cpus_allowed_list}\n",
        )

    def mountinfo(self, *mounts: tuple[str, str, str, str, str]) -> None:
        """/proc/self/mountinfo lines: (major:minor, mount point, fstype, source, super options)."""
        lines = [
            f"{20 + i} 1 {devno} / {mp} rw,relatime shared:{i} - {fstype} {source} {opts}"
            for i, (devno, mp, fstype, source, opts) in enumerate(mounts)
        ]
        self.write("/proc/self/mountinfo", "\n".join(lines) + "\n")

    def cpuinfo(self, model: str, flags: Iterable[str], count: int = 2) -> None:
        flagline = " ".join(flags)
        blocks = [
            f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\nflags\t\t: {flagline}\n"
            for i in range(count)
        ]
        self.write("/proc/cpuinfo", "\n".join(blocks))

    # -- sysfs: NUMA, CPUs, PCI --------------------------------------------------------------------
    def numa_node(
        self, node: int, cpulist: str, mem_total_kib: int | None = None, mem_free_kib: int | None = None
    ) -> str:
        base = f"/sys/devices/system/node/node{node}"
        self.write(f"{base}/cpulist", cpulist + "\n")
        if mem_total_kib is not None:
            free = mem_free_kib if mem_free_kib is not None else mem_total_kib // 2
            self.write(
                f"{base}/meminfo",
                f"Node {node} MemTotal:       {mem_total_kib} kB\nNode {node} MemFree:        {free} kB\n"
                f"Node {node} MemUsed:        {mem_total_kib - free} kB\n",
            )
        return base

    def cpus(self, count: int) -> None:
        for i in range(count):
            self.write(f"/sys/devices/system/cpu/cpu{i}/topology/physical_package_id", "0\n")
        self.write("/sys/devices/system/cpu/online", f"0-{count - 1}\n" if count > 1 else "0\n")

    def cpufreq(self, cpus: Iterable[int], governor: str, driver: str = "acpi-cpufreq") -> None:
        """One cpufreq policy per CPU, and cpuN/cpufreq as the kernel's link to it."""
        for cpu in cpus:
            policy = f"/sys/devices/system/cpu/cpufreq/policy{cpu}"
            self.write(f"{policy}/scaling_governor", governor + "\n")
            self.write(f"{policy}/scaling_driver", driver + "\n")
            self.write(f"{policy}/affected_cpus", f"{cpu}\n")
            self.write(f"{policy}/scaling_available_governors", "performance powersave ondemand\n")
            self.write(f"{policy}/cpuinfo_max_freq", "3600000\n")
            self.write(f"{policy}/scaling_max_freq", "3600000\n")
            self.link(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq", f"../cpufreq/policy{cpu}")

    def pci_device(self, bus_id: str, **files: str) -> str:
        """/sys/devices/pci<domain:bus>/<bus_id>/<files>, linked from /sys/bus/pci/devices/<bus_id>."""
        domain_bus = bus_id.rsplit(":", 1)[0]
        devpath = f"pci{domain_bus}/{bus_id}"
        for name, value in files.items():
            self.write(f"/sys/devices/{devpath}/{name}", f"{value}\n")
        self.sys_link(f"/sys/bus/pci/devices/{bus_id}", devpath)
        return devpath

    def nvidia_gpu(
        self,
        bus_id: str,
        numa_node: int = -1,
        local_cpulist: str | None = None,
        device: str = "0x2335",
        **files: str,
    ) -> str:
        extra = dict(files)
        if local_cpulist is not None:
            extra["local_cpulist"] = local_cpulist
        return self.pci_device(
            bus_id, vendor="0x10de", device=device, **{"class": "0x030200"}, numa_node=str(numa_node), **extra
        )

    # -- sysfs: block devices ----------------------------------------------------------------------
    def disk(
        self,
        name: str,
        parent_path: str,
        *,
        rotational: bool | None,
        partitions: Iterable[str] = (),
        devno: str | None = None,
        model: str | None = None,
        transport: str | None = None,
    ) -> str:
        """A whole disk at /sys/devices/<parent_path>/block/<name>, linked from class/block and block."""
        devpath = f"{parent_path}/block/{name}"
        base = f"/sys/devices/{devpath}"
        if rotational is not None:
            self.write(f"{base}/queue/rotational", "1\n" if rotational else "0\n")
        self.write(f"{base}/size", "1000000\n")
        if devno:
            self.write(f"{base}/dev", devno + "\n")
            self.sys_link(f"/sys/dev/block/{devno}", devpath)
        if model:
            self.write(f"/sys/devices/{parent_path}/model", model + "\n")
        if transport:
            self.write(f"/sys/devices/{parent_path}/transport", transport + "\n")
        self.sys_link(f"/sys/class/block/{name}", devpath)
        self.sys_link(f"/sys/block/{name}", devpath)
        for i, part in enumerate(partitions, start=1):
            self.partition(name, devpath, part, i)
        return devpath

    def partition(
        self, disk: str, disk_devpath: str, part: str, number: int = 1, devno: str | None = None
    ) -> str:
        devpath = f"{disk_devpath}/{part}"
        self.write(f"/sys/devices/{devpath}/partition", f"{number}\n")
        if devno:
            self.write(f"/sys/devices/{devpath}/dev", devno + "\n")
            self.sys_link(f"/sys/dev/block/{devno}", devpath)
        self.sys_link(f"/sys/class/block/{part}", devpath)
        return devpath

    def stacked(self, name: str, slaves: Iterable[str], dm_name: str | None = None) -> str:
        """A dm-N or mdN device over ``slaves`` (/sys/devices/virtual/block/<name>/slaves/<slave> links)."""
        devpath = f"virtual/block/{name}"
        base = f"/sys/devices/{devpath}"
        self.write(f"{base}/size", "1000000\n")
        self.mkdir(f"{base}/slaves")
        for slave in slaves:
            real = self.path(f"/sys/class/block/{slave}").resolve()
            target = os.path.relpath(real, self.path(f"{base}/slaves"))
            self.link(f"{base}/slaves/{slave}", target)
        if dm_name:
            self.write(f"{base}/dm/name", dm_name + "\n")
        self.sys_link(f"/sys/class/block/{name}", devpath)
        self.sys_link(f"/sys/block/{name}", devpath)
        return devpath

    def zram(self, name: str = "zram0") -> str:
        return self.disk(name, VIRTUAL_PATH, rotational=False)

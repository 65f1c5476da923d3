"""Swap areas traced to the disks under them, and what kind of disk each is.

Sources (all through the host root):
- ``/proc/swaps``: every swap area (a partition/device, or a file);
- a swap file -> its filesystem's device: ``os.stat(file).st_dev`` on the live host, else the
  mount table (``/proc/self/mountinfo``'s major:minor, or the device of ``/proc/mounts``);
- ``/sys/dev/block/MAJ:MIN``, ``/sys/class/block/<name>``, ``/sys/block/<name>``: the device;
  a partition's parent directory is its disk; ``dm-*``/``md*`` stack over ``slaves/``;
- the disk's resolved sysfs path (``.../nvme/...``, ``.../virtio...``, ``.../ata3/...``),
  ``queue/rotational`` and ``device/transport``: NVMe, SATA/SAS SSD, rotational disk, zram, virtio;
- on the live host, udev properties through pyudev when libudev loads (``ID_BUS``,
  ``ID_ATA_ROTATION_RATE_RPM``); sysfs alone otherwise and for snapshots.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.host import Host
from tuner.probes.memory import Mount, mount_for, read_meminfo, read_mounts, unescape_mount_field

UdevProps = Callable[[str], dict[str, str] | None]
"""name -> udev properties of the block device (live host with libudev only)."""

if TYPE_CHECKING:
    from tuner.probes import Facts


class Media(enum.StrEnum):
    NVME = "nvme"
    SSD = "ssd"  # SATA/SAS solid state
    ROTATIONAL = "rotational"  # spinning disk
    ZRAM = "zram"  # compressed RAM
    VIRTIO = "virtio"  # a virtual disk: the medium behind it is the hypervisor's
    UNKNOWN = "unknown"

    @property
    def slowness(self) -> int:
        """Worse media rank higher; a stack is as slow as its slowest member."""
        return _SLOWNESS[self]


_SLOWNESS = {
    Media.ZRAM: 0,
    Media.NVME: 1,
    Media.VIRTIO: 2,
    Media.UNKNOWN: 3,
    Media.SSD: 4,
    Media.ROTATIONAL: 5,
}


@dataclass(frozen=True)
class SwapEntry:
    """One line of /proc/swaps."""

    filename: str  # "/dev/nvme0n1p3", "/swapfile" (octal escapes undone, " (deleted)" kept)
    type: str  # "partition" | "file"
    size: int  # bytes (the file says KiB)
    used: int  # bytes
    priority: int


@dataclass(frozen=True)
class Disk:
    name: str  # the whole disk under the swap area ("sda", "nvme0n1", "zram0")
    media: Media
    rotational: bool | None  # /sys/class/block/<name>/queue/rotational
    sysfs_path: str | None  # the resolved /sys/devices/... path of the disk
    transport: (
        str | None
    )  # "nvme" | "ata" | "sas" | "scsi" | "usb" | "virtio" | None (sysfs path, udev ID_BUS)
    model: str | None = None  # device/model


@dataclass(frozen=True)
class SwapArea:
    entry: SwapEntry
    device: str | None  # the block device holding the area ("sda2", "dm-1", "nvme0n1p2")
    disks: tuple[Disk, ...]  # the physical disks under it (several for dm/md)
    media: Media  # the slowest of ``disks``; UNKNOWN when untraced
    trace: tuple[str, ...]  # how it was traced, one step per item, for the evidence
    reason: str = ""  # why it could not be traced


@dataclass(frozen=True)
class SwapFacts:
    areas: tuple[SwapArea, ...]
    state_reason: str  # why /proc/swaps could not be read, "" when it was
    mem_total: int | None  # bytes, /proc/meminfo MemTotal
    mem_available: int | None  # bytes, /proc/meminfo MemAvailable
    udev: bool  # whether udev properties were consulted


# -- pure parsers -------------------------------------------------------------------------------
def parse_swaps(text: str) -> list[SwapEntry]:
    """``/proc/swaps``: a header, then "FILENAME TYPE SIZE USED PRIORITY" (KiB). Bad lines are left out."""
    entries: list[SwapEntry] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] == "Filename":
            continue
        # The name may carry " (deleted)"; numbers are the last three fields.
        try:
            size, used, prio = int(fields[-3]), int(fields[-2]), int(fields[-1])
        except ValueError:
            continue
        name = unescape_mount_field(" ".join(fields[:-4]))
        if size < 0 or used < 0 or not name:
            continue
        entries.append(SwapEntry(name, fields[-4], size * 1024, used * 1024, prio))
    return entries


def media_from_sysfs(
    name: str, sysfs_path: str | None, rotational: bool | None, transport: str | None
) -> Media:
    """Classify a whole disk from its name, resolved sysfs path, rotational flag and transport."""
    path = sysfs_path or ""
    if name.startswith("zram"):
        return Media.ZRAM
    if name.startswith("nvme") or "/nvme" in path or transport == "nvme":
        return Media.NVME
    if name.startswith(("vd", "xvd")) or "/virtio" in path or transport == "virtio":
        return Media.VIRTIO
    if rotational is True:
        return Media.ROTATIONAL
    is_scsi_like = (
        name.startswith("sd")
        or transport in ("ata", "sata", "sas", "scsi")
        or "/ata" in path
        or "/host" in path
        or "/target" in path
    )
    if rotational is False and is_scsi_like:
        return Media.SSD
    return Media.UNKNOWN


# -- tracing ------------------------------------------------------------------------------------
def _block_path(host: Host, name: str) -> str | None:
    """The sysfs directory of a block device or partition, links resolved."""
    for base in ("/sys/class/block", "/sys/block"):
        cand = f"{base}/{name}"
        if host.exists(cand):
            return host.resolve(cand)
    # a partition listed only under its disk (/sys/block/sda/sda1)
    disks = host.listdir("/sys/block")
    for disk in disks.value or []:
        cand = f"/sys/block/{disk}/{name}"
        if host.exists(f"{cand}/partition"):
            return host.resolve(cand)
    return None


def _name_of_dev(host: Host, major: int, minor: int) -> str | None:
    """The block device name of major:minor through /sys/dev/block (uevent DEVNAME, or the link's name)."""
    base = f"/sys/dev/block/{major}:{minor}"
    uevent = host.read_text(f"{base}/uevent", limit=16 << 10)
    if uevent.ok and uevent.value:
        for line in uevent.value.splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1].strip() or None
    if host.exists(base):
        resolved = host.resolve(base)
        return resolved.rstrip("/").rsplit("/", 1)[-1] or None
    return None


def _dev_name_from_source(host: Host, source: str) -> str | None:
    """/dev/sda2 -> sda2; /dev/mapper/vg-swap -> the dm-N whose dm/name is vg-swap."""
    if not source.startswith("/dev/"):
        return None
    rest = source[len("/dev/") :]
    if rest.startswith("mapper/"):
        wanted = rest[len("mapper/") :]
        for base in ("/sys/class/block", "/sys/block"):
            for name in host.listdir(base).value or []:
                if name.startswith("dm-") and host.read_value(f"{base}/{name}/dm/name").value == wanted:
                    return name
        return None
    if rest.startswith("disk/") or "/" in rest:
        real = host.resolve(source)  # /dev/disk/by-uuid/... is a link into /dev on the live host
        rest = real.rsplit("/", 1)[-1]
    return rest or None


def _transport(host: Host, path: str, udev: dict[str, str] | None) -> str | None:
    if udev and udev.get("ID_BUS"):
        return udev["ID_BUS"].lower()
    t = host.read_value(f"{path}/device/transport")
    if t.ok and t.value:
        return t.value.lower()
    for marker, name in (("/nvme", "nvme"), ("/virtio", "virtio"), ("/usb", "usb"), ("/ata", "ata")):
        if marker in path:
            return name
    if "/host" in path and "/target" in path:
        return "scsi"
    return None


def _disk(host: Host, name: str, path: str, udev_props: UdevProps | None) -> Disk:
    rot = host.read_value(f"{path}/queue/rotational")
    rotational = {"1": True, "0": False}.get((rot.value or "").strip()) if rot.ok else None
    props = udev_props(name) if udev_props else None
    if props and props.get("ID_ATA_ROTATION_RATE_RPM") not in (None, ""):
        rotational = props["ID_ATA_ROTATION_RATE_RPM"] != "0"
    transport = _transport(host, path, props)
    model_r = host.read_value(f"{path}/device/model")
    model = model_r.value if model_r.ok and model_r.value else None
    return Disk(name, media_from_sysfs(name, path, rotational, transport), rotational, path, transport, model)


def trace_device(
    host: Host, name: str, udev_props: UdevProps | None = None, depth: int = 0
) -> tuple[list[Disk], list[str]]:
    """The whole disks under a block device: partition -> disk; dm/md -> its slaves, recursively."""
    trace: list[str] = []
    if depth > 8:
        return [], ["stack too deep"]
    path = _block_path(host, name)
    if path is None:
        return [], [f"{name}: not in /sys/class/block"]
    if host.exists(f"{path}/partition"):
        parent = path.rstrip("/").rsplit("/", 1)[0]
        disk_name = parent.rsplit("/", 1)[-1]
        trace.append(f"{name} is a partition of {disk_name}")
        name, path = disk_name, parent
    slaves = host.listdir(f"{path}/slaves")
    if slaves.ok and slaves.value:
        trace.append(f"{name} sits on {', '.join(slaves.value)}")
        disks: list[Disk] = []
        for slave in slaves.value:
            d, t = trace_device(host, slave, udev_props, depth + 1)
            disks.extend(d)
            trace.extend(t)
        return disks, trace
    disk = _disk(host, name, path, udev_props)
    trace.append(f"{name}: {disk.media.value} ({path})")
    return [disk], trace


def _udev_props_fn(host: Host) -> UdevProps | None:
    """A name -> udev properties lookup on the live host when libudev loads; None otherwise."""
    if not host.live:
        return None
    try:
        import pyudev

        context = pyudev.Context()
    except Exception:  # ImportError, or libudev missing (pyudev raises ImportError/OSError variants)
        return None

    def props(name: str) -> dict[str, str] | None:
        try:
            dev = pyudev.Devices.from_name(context, "block", name)
            return {
                k: str(dev.properties.get(k, "")) for k in ("ID_BUS", "ID_ATA_ROTATION_RATE_RPM", "ID_MODEL")
            }
        except Exception:  # a device that vanished or that udev does not know
            return None

    return props


def _device_of_file(host: Host, filename: str, mounts: list[Mount]) -> tuple[str | None, list[str]]:
    trace: list[str] = []
    clean = filename.removesuffix(" (deleted)")
    if host.live:
        try:
            st = os.stat(host.path(clean))
        except OSError as exc:
            trace.append(f"stat {clean}: {exc.strerror or exc}")
        else:
            major, minor = os.major(st.st_dev), os.minor(st.st_dev)
            name = _name_of_dev(host, major, minor)
            trace.append(f"{clean} is on device {major}:{minor}" + (f" ({name})" if name else ""))
            if name:
                return name, trace
    m = mount_for(mounts, clean)
    if m is None:
        trace.append(f"no mount holds {clean}")
        return None, trace
    trace.append(f"{clean} is on the {m.fstype} filesystem {m.device} mounted at {m.mount_point}")
    if m.major is not None and m.minor is not None and m.major != 0:
        name = _name_of_dev(host, m.major, m.minor)
        if name:
            return name, trace
    return _dev_name_from_source(host, m.device), trace


def probe(facts: Facts) -> SwapFacts:
    host = facts.host
    info, _ = read_meminfo(host)
    r = host.read_text("/proc/swaps", limit=1 << 20)
    if not r.ok or r.value is None:
        return SwapFacts(
            (), r.reason or "/proc/swaps unreadable", info.get("MemTotal"), info.get("MemAvailable"), False
        )
    entries = parse_swaps(r.value)
    if not entries:
        return SwapFacts((), "", info.get("MemTotal"), info.get("MemAvailable"), False)
    udev_props = _udev_props_fn(host)
    mounts: list[Mount] = []
    if any(e.type != "partition" for e in entries):
        mounts, _ = read_mounts(host)
    areas: list[SwapArea] = []
    for e in entries:
        trace: list[str] = []
        device: str | None
        if e.type == "partition":
            device = _dev_name_from_source(host, e.filename) or e.filename.rsplit("/", 1)[-1]
        else:
            device, trace = _device_of_file(host, e.filename, mounts)
        disks: list[Disk] = []
        reason = ""
        if device:
            d, t = trace_device(host, device, udev_props)
            disks, trace = d, trace + t
            if not disks:
                reason = f"{device} could not be traced to a disk in sysfs"
        else:
            reason = f"could not tell which device holds {e.filename}"
        media = max((d.media for d in disks), key=lambda m: m.slowness) if disks else Media.UNKNOWN
        areas.append(SwapArea(e, device, tuple(disks), media, tuple(trace), reason))
    return SwapFacts(tuple(areas), "", info.get("MemTotal"), info.get("MemAvailable"), udev_props is not None)

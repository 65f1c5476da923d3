"""NUMA topology: nodes, each NVIDIA GPU's node, this process's CPU affinity, automatic balancing.

Sources (all through the host root):
- ``/sys/devices/system/node/nodeN/{cpulist,meminfo}``: the nodes, their CPUs and memory;
- ``/sys/bus/pci/devices/<bus id>/{numa_node,local_cpulist}``: where each GPU sits
  (``numa_node`` reads -1 when the firmware does not say; NVML's value wins when it has one);
- ``os.sched_getaffinity(0)`` on the live host, ``Cpus_allowed_list`` of ``/proc/self/status``
  in a snapshot: the CPUs this process may run on;
- ``/proc/sys/kernel/numa_balancing``: automatic NUMA balancing (1 on, 0 off).

The launch and plan stages use :func:`numactl_argv`, :func:`launch_node` and
:func:`node_with_most_free_memory` to bind vLLM next to its GPU.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.host import Host, State

if TYPE_CHECKING:
    from tuner.probes import Facts

NODE_ROOT = "/sys/devices/system/node"
PCI_DEVICES = "/sys/bus/pci/devices"
NVIDIA_VENDOR = "0x10de"
_MAX_CPUS = 1 << 16  # far above the kernel's NR_CPUS; a larger cpulist is garbage
_NODE_DIR = re.compile(r"node(\d+)$")


@dataclass(frozen=True)
class NumaNode:
    id: int  # N of /sys/devices/system/node/nodeN
    cpus: tuple[int, ...]  # /sys/devices/system/node/nodeN/cpulist, expanded
    cpulist: str  # the same in cpulist notation ("32-63"); "" for a memory-only node
    mem_total: int | None  # bytes, "Node N MemTotal" of nodeN/meminfo
    mem_free: int | None  # bytes, "Node N MemFree" of nodeN/meminfo
    # bytes the node can hand out without swapping: MemFree + FilePages - Shmem + KReclaimable of
    # nodeN/meminfo (page cache and reclaimable slab), as the kernel's MemAvailable counts them. After a
    # model was read from disk its pages sit in the cache, and MemFree alone says the node is full.
    mem_available: int | None = None

    @property
    def available(self) -> int | None:
        """Memory a process bound to this node can get: mem_available, else mem_free."""
        return self.mem_available if self.mem_available is not None else self.mem_free


@dataclass(frozen=True)
class GpuNuma:
    pci_bus_id: str  # "0000:3b:00.0", sysfs spelling (lower case, 4-digit domain)
    index: int | None  # NVML index when the GPU inventory is known
    name: str | None  # NVML name ("NVIDIA H200"), None when found through sysfs only
    node: int | None  # NVML's NUMA node, else /sys/bus/pci/devices/<id>/numa_node; None = not reported (-1)
    node_source: str  # "nvml" | "sysfs" | "none"
    local_cpulist: str | None  # /sys/bus/pci/devices/<id>/local_cpulist (or local_cpus mask), normalised
    local_cpus: tuple[int, ...] | None = None  # the same, expanded; None when not reported or garbage


@dataclass(frozen=True)
class NumaFacts:
    nodes: tuple[NumaNode, ...]  # /sys/devices/system/node/node*; empty when the kernel reports none
    balancing: int | None  # /proc/sys/kernel/numa_balancing (0 off, 1 on, 2 memory tiering)
    process_cpus: tuple[int, ...] | None  # sched_getaffinity(0) live; /proc/self/status Cpus_allowed_list
    gpu_nodes: dict[str, int | None]  # pci bus id -> NUMA node (None: not reported)
    gpus: tuple[GpuNuma, ...] = ()  # the same GPUs with their local CPUs and where the node came from
    process_cpus_source: str = ""  # "sched_getaffinity" | "/proc/self/status" | "" (unknown)
    nodes_reason: str = ""  # why ``nodes`` is empty
    gpu_source: str = ""  # "nvml" | "nvidia-smi.xml" | "sysfs": how the GPUs were found
    extra: dict[str, Any] = field(default_factory=dict)  # readings kept for the evidence

    @property
    def multi_node(self) -> bool:
        """More than one node that has CPUs (memory-only CXL/HBM nodes do not change binding)."""
        return sum(1 for n in self.nodes if n.cpus) > 1


# -- pure helpers -------------------------------------------------------------------------------
def parse_cpulist(text: str) -> tuple[int, ...]:
    """Expand the kernel's cpulist notation ("0-3,8-11", "0-31:2/4" strides) into sorted CPU ids.

    Raises ValueError on anything else; an empty string is no CPUs.
    """
    text = text.strip()
    if not text:
        return ()
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in cpulist {text!r}")
        stride_used, stride_group = 1, 1
        if ":" in part:
            part, _, stride = part.partition(":")
            used, _, group = stride.partition("/")
            stride_used, stride_group = int(used), int(group)
            if stride_used <= 0 or stride_group <= 0 or stride_used > stride_group:
                raise ValueError(f"bad stride in cpulist {text!r}")
        lo_s, dash, hi_s = part.partition("-")
        lo = int(lo_s)
        hi = int(hi_s) if dash else lo
        if lo < 0 or hi < lo or hi >= _MAX_CPUS:
            raise ValueError(f"bad range {part!r} in cpulist {text!r}")
        for start in range(lo, hi + 1, stride_group):
            cpus.update(c for c in range(start, min(start + stride_used, hi + 1)))
        if len(cpus) > _MAX_CPUS:
            raise ValueError("cpulist too large")
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """The cpulist notation of a set of CPU ids: (0, 1, 2, 3, 8, 9) -> "0-3,8-9"."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpumask(text: str) -> tuple[int, ...]:
    """Expand a hex CPU mask ("ffff", "00000000,000000ff") into CPU ids."""
    digits = text.strip().replace(",", "")
    if not digits:
        return ()
    if len(digits) > _MAX_CPUS // 4:
        raise ValueError("cpumask too large")
    value = int(digits, 16)
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)


def _available(mem: dict[str, int]) -> int | None:
    """MemFree plus what the kernel can reclaim at once (clean page cache, reclaimable slab)."""
    if "MemFree" not in mem or "FilePages" not in mem:
        return None
    cache = max(0, mem["FilePages"] - mem.get("Shmem", 0))
    return mem["MemFree"] + cache + mem.get("KReclaimable", mem.get("SReclaimable", 0))


def numactl_argv(node: int) -> list[str]:
    """The prefix that binds a process's CPUs and memory to one node."""
    return ["numactl", f"--cpunodebind={node}", f"--membind={node}"]


def node_with_most_free_memory(facts: NumaFacts) -> int | None:
    """The node (with CPUs) that has the most memory available; None when no node reports it."""
    known = [n for n in facts.nodes if n.available is not None and n.cpus]
    if not known:
        return None
    return max(known, key=lambda n: (n.available or 0, -n.id)).id


def launch_node(facts: NumaFacts, pci_bus_ids: Iterable[str] | None = None) -> int | None:
    """The node `gputune launch` binds to, or None when binding does not matter (one node).

    The node of the first of the given GPUs (all GPUs when None) whose node is known;
    on a multi-node host without such a GPU, the node with the most free memory.
    """
    if not facts.multi_node:
        return None
    wanted = [b.lower() for b in pci_bus_ids] if pci_bus_ids is not None else list(facts.gpu_nodes)
    for bus in wanted:
        node = facts.gpu_nodes.get(bus)
        if node is not None:
            return node
    return node_with_most_free_memory(facts)


def node_of_cpus(facts: NumaFacts, cpus: Iterable[int]) -> set[int]:
    """The nodes whose CPUs the given CPUs touch."""
    want = set(cpus)
    return {n.id for n in facts.nodes if want & set(n.cpus)}


def parse_status_cpus(text: str) -> tuple[int, ...] | None:
    """``Cpus_allowed_list`` of a /proc/PID/status text; None when the line is missing."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Cpus_allowed_list":
            return parse_cpulist(value)
    return None


# -- reading ------------------------------------------------------------------------------------
def read_nodes(host: Host) -> tuple[tuple[NumaNode, ...], str]:
    from tuner.probes.memory import parse_meminfo

    listing = host.listdir(NODE_ROOT)
    if not listing.ok or listing.value is None:
        return (), listing.reason or "the kernel reports no NUMA nodes"
    nodes: list[NumaNode] = []
    for name in listing.value:
        m = _NODE_DIR.match(name)
        if not m:
            continue
        nid = int(m.group(1))
        base = f"{NODE_ROOT}/{name}"
        cpulist_r = host.read_value(f"{base}/cpulist")
        cpus: tuple[int, ...] = ()
        if cpulist_r.ok and cpulist_r.value is not None:
            try:
                cpus = parse_cpulist(cpulist_r.value)
            except ValueError:
                cpus = ()
        mem_r = host.read_text(f"{base}/meminfo", limit=64 << 10)
        mem = parse_meminfo(mem_r.value) if mem_r.ok and mem_r.value is not None else {}
        total, free = mem.get("MemTotal"), mem.get("MemFree")
        nodes.append(NumaNode(nid, cpus, format_cpulist(cpus), total, free, _available(mem)))
    nodes.sort(key=lambda n: n.id)
    return tuple(nodes), "" if nodes else "no nodeN entries under /sys/devices/system/node"


def _sysfs_nvidia_gpus(host: Host) -> list[str]:
    """PCI bus ids of NVIDIA display/3D controllers (class 0x0300xx / 0x0302xx) in sysfs."""
    listing = host.listdir(PCI_DEVICES)
    found: list[str] = []
    for bus in listing.value or []:
        vendor = host.read_value(f"{PCI_DEVICES}/{bus}/vendor")
        if not vendor.ok or (vendor.value or "").lower() != NVIDIA_VENDOR:
            continue
        cls = (host.read_value(f"{PCI_DEVICES}/{bus}/class").value or "").lower()
        if cls.startswith(("0x0300", "0x0302")):
            found.append(bus.lower())
    return found


def _sysfs_gpu(host: Host, bus: str) -> tuple[int | None, tuple[int, ...] | None]:
    node = host.read_value(f"{PCI_DEVICES}/{bus}/numa_node").as_int()
    cpus: tuple[int, ...] | None = None
    cpulist_r = host.read_value(f"{PCI_DEVICES}/{bus}/local_cpulist")
    mask_r = host.read_value(f"{PCI_DEVICES}/{bus}/local_cpus")
    for reading, parser in ((cpulist_r, parse_cpulist), (mask_r, parse_cpumask)):
        if cpus is None and reading.ok and reading.value:
            try:
                cpus = parser(reading.value) or None
            except ValueError:
                cpus = None
    return (node if node is not None and node >= 0 else None), cpus


def _fmt(cpus: tuple[int, ...] | None) -> str | None:
    return format_cpulist(cpus) if cpus else None


def _gpu_inventory(facts: Facts) -> Any:
    """The GPU engineer's inventory, or None when it is unavailable or broke (sysfs still tells)."""
    try:
        return facts.get("gpu")
    except Exception:  # the GPU probe is optional for NUMA: sysfs knows where the cards sit
        return None


def read_gpus(facts: Facts) -> tuple[tuple[GpuNuma, ...], str]:
    host = facts.host
    inv = _gpu_inventory(facts)
    gpus: list[GpuNuma] = []
    if inv is not None and getattr(inv, "state", None) is State.OK and bool(getattr(inv, "gpus", None)):
        for g in inv.gpus:
            bus = str(g.pci_bus_id).lower()
            node_sysfs, cpus = _sysfs_gpu(host, bus)
            if g.numa_node is not None and g.numa_node >= 0:
                node, source = int(g.numa_node), "nvml"
            elif node_sysfs is not None:
                node, source = node_sysfs, "sysfs"
            else:
                node, source = None, "none"
            gpus.append(GpuNuma(bus, g.index, g.name, node, source, _fmt(cpus), cpus))
        return tuple(gpus), str(getattr(inv, "source", "") or "nvml")
    for bus in _sysfs_nvidia_gpus(host):
        node, cpus = _sysfs_gpu(host, bus)
        gpus.append(GpuNuma(bus, None, None, node, "sysfs" if node is not None else "none", _fmt(cpus), cpus))
    return tuple(gpus), "sysfs"


def read_process_cpus(host: Host) -> tuple[tuple[int, ...] | None, str]:
    if host.live:
        try:
            return tuple(sorted(os.sched_getaffinity(0))), "sched_getaffinity"
        except OSError:
            pass
    status = host.read_text("/proc/self/status", limit=256 << 10)
    if status.ok and status.value is not None:
        try:
            cpus = parse_status_cpus(status.value)
        except ValueError:
            cpus = None
        if cpus is not None:
            return cpus, "/proc/self/status"
    return None, ""


def probe(facts: Facts) -> NumaFacts:
    host = facts.host
    nodes, reason = read_nodes(host)
    bal = host.read_value("/proc/sys/kernel/numa_balancing")
    gpus, gpu_source = read_gpus(facts)
    cpus, cpus_source = read_process_cpus(host)
    return NumaFacts(
        nodes=nodes,
        balancing=bal.as_int(),
        process_cpus=cpus,
        gpu_nodes={g.pci_bus_id: g.node for g in gpus},
        gpus=gpus,
        process_cpus_source=cpus_source,
        nodes_reason=reason,
        gpu_source=gpu_source,
        extra={"numa_balancing_state": bal.state.value, "numa_balancing_reason": bal.reason},
    )

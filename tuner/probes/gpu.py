"""GPU probe: the inventory from :func:`tuner.gpu.read_gpus`, with process names filled in.

NVML gives PIDs only; on the live host each name comes from ``/proc/PID/comm``
(a snapshot's ``nvidia-smi.xml`` already carries ``<process_name>``).
"""

from __future__ import annotations

import dataclasses

from tuner.gpu import GpuInfo, GpuInventory, GpuProcess, read_gpus
from tuner.probes import Facts

# Host paths this probe reads (the snapshot copies them): the GPU's PCI device for the NUMA node.
CAPTURE = (
    "/sys/bus/pci/devices/*/vendor",
    "/sys/bus/pci/devices/*/class",
    "/sys/bus/pci/devices/*/numa_node",
    "/sys/bus/pci/devices/*/local_cpulist",
)


def _named(facts: Facts, proc: GpuProcess) -> GpuProcess:
    if proc.name:
        return proc
    comm = facts.host.read_value(f"/proc/{proc.pid}/comm")
    return dataclasses.replace(proc, name=comm.value) if comm.ok and comm.value else proc


def _with_names(facts: Facts, gpu: GpuInfo) -> GpuInfo:
    if not gpu.processes:
        return gpu
    return dataclasses.replace(gpu, processes=tuple(_named(facts, p) for p in gpu.processes))


def probe(facts: Facts) -> GpuInventory:
    inv = read_gpus(facts.host)
    if not inv.gpus:
        return inv
    return dataclasses.replace(inv, gpus=tuple(_with_names(facts, g) for g in inv.gpus))

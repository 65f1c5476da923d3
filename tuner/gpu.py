"""GPU facts, and the one adapter that owns NVML (nothing else imports pynvml).

Two sources give the same records:
- the live host: NVML through ``pynvml`` (lazy init, shutdown at exit, a clear
  message when the driver is not loaded);
- a snapshot: ``nvidia-smi.xml`` (output of ``nvidia-smi -q -x``) at the
  snapshot's top level, plus ``nvml.json`` when `gputune snapshot` wrote one.

Both are read through :func:`read_gpus`, which returns a :class:`GpuInventory`
whose ``state`` says whether there are no GPUs here (absent), the driver is
not loaded (error with the reason), or NVML works (ok).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.host import Reading, State


@dataclass(frozen=True)
class GpuProcess:
    pid: int  # nvmlDeviceGetComputeRunningProcesses / <processes><process_info><pid>
    name: str | None  # /proc/PID/comm on the live host, <process_name> in XML
    used_bytes: int | None  # usedGpuMemory (None: NVML could not tell, e.g. in a container)
    kind: str = "compute"  # compute | graphics


@dataclass(frozen=True)
class PcieLink:
    gen_current: int | None  # nvmlDeviceGetCurrPcieLinkGeneration / <pcie_gen><current_link_gen>
    gen_max: int | None  # nvmlDeviceGetMaxPcieLinkGeneration: max of GPU *and* the slot/host
    gen_gpu_max: int | None  # nvmlDeviceGetGpuMaxPcieLinkGeneration: what the GPU itself supports
    width_current: int | None  # nvmlDeviceGetCurrPcieLinkWidth / <link_widths><current_link_width>
    width_max: int | None  # nvmlDeviceGetMaxPcieLinkWidth


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str | None
    pci_bus_id: str  # "0000:00:06.0": NVML's 8-hex-digit domain cut to sysfs' 4
    memory_total: int  # bytes, nvmlDeviceGetMemoryInfo.total
    memory_used: int  # bytes, nvmlDeviceGetMemoryInfo.used
    memory_free: int  # bytes, nvmlDeviceGetMemoryInfo.free
    compute_capability: tuple[int, int] | None  # nvmlDeviceGetCudaComputeCapability
    pcie: PcieLink | None
    numa_node: int | None  # NVML numa node id, else sysfs numa_node; None when not reported (-1)
    processes: tuple[GpuProcess, ...] = ()
    persistence_mode: bool | None = None
    ecc_enabled: bool | None = None
    mig_enabled: bool | None = None
    utilization_gpu: int | None = None  # percent
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None
    clock_sm_mhz: int | None = None
    clock_sm_max_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()  # active clock event reasons, by name
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    ecc_uncorrected_volatile: int | None = None


@dataclass(frozen=True)
class GpuInventory:
    state: State  # OK: NVML/XML read; ABSENT: no NVIDIA GPU here; ERROR/DENIED: driver problem
    reason: str = ""
    driver_version: str | None = None  # nvmlSystemGetDriverVersion
    cuda_driver_version: tuple[int, int] | None = None  # nvmlSystemGetCudaDriverVersion_v2, (13, 0)
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)
    source: str = ""  # "nvml" | "nvidia-smi.xml"

    def as_reading(self) -> Reading[tuple[GpuInfo, ...]]:
        if self.state is State.OK:
            return Reading.of(self.gpus)
        return Reading.missing(self.state, self.reason)

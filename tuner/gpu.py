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

import atexit
import contextlib
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xml.etree import ElementTree

from tuner.host import NVIDIA_SMI_XML, NVML_JSON, Host, Reading, State

MIB = 1 << 20
NVIDIA_VENDOR = "0x10de"


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
    architecture: str | None = None  # <product_architecture>, nvmlDeviceGetArchitecture ("Hopper")
    compute_capability_source: str = ""  # "nvml" | "nvml.json" | "product name" (XML has no CC)


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


def read_gpus(host: Host) -> GpuInventory:
    """The GPUs of a host root: NVML on the live host, ``nvidia-smi.xml`` (+ ``nvml.json``) on a snapshot."""
    if host.live:
        return read_nvml(host)
    return read_snapshot(host)


# ------------------------------------------------------------------------------------------------
# Names shared by both sources
# ------------------------------------------------------------------------------------------------
# nvidia-smi -q -x carries no compute capability; these product families are unambiguous.
# Source: NVIDIA "CUDA GPUs - Compute Capability" table (developer.nvidia.com/cuda-gpus).
_CC_BY_NAME: tuple[tuple[str, tuple[int, int]], ...] = (
    ("GB200", (10, 0)),
    ("B200", (10, 0)),
    ("B100", (10, 0)),
    ("RTX PRO 6000", (12, 0)),
    ("RTX 50", (12, 0)),
    ("H200", (9, 0)),
    ("H100", (9, 0)),
    ("H800", (9, 0)),
    ("H20", (9, 0)),
    ("GH200", (9, 0)),
    ("L40", (8, 9)),
    ("L4", (8, 9)),
    ("RTX 6000 Ada", (8, 9)),
    ("RTX 40", (8, 9)),
    ("A100", (8, 0)),
    ("A800", (8, 0)),
    ("A30", (8, 0)),
    ("A40", (8, 6)),
    ("A10", (8, 6)),
    ("RTX A", (8, 6)),
    ("RTX 30", (8, 6)),
    ("T4", (7, 5)),
    ("RTX 20", (7, 5)),
    ("V100", (7, 0)),
)
# The lowest compute capability of each architecture: safe for "sm_80+" style questions.
_CC_BY_ARCH = {
    "Blackwell": (10, 0),
    "Hopper": (9, 0),
    "Ada Lovelace": (8, 9),
    "Ampere": (8, 0),
    "Turing": (7, 5),
    "Volta": (7, 0),
    "Pascal": (6, 0),
}


def compute_capability_from_name(name: str, architecture: str | None = None) -> tuple[int, int] | None:
    """The compute capability of a product name (or, failing that, the lowest of its architecture)."""
    upper = name.upper()
    for needle, cc in _CC_BY_NAME:
        if needle.upper() in upper:
            return cc
    return _CC_BY_ARCH.get(architecture or "")


def normalize_bus_id(bus_id: str) -> str:
    """NVML's "00000000:3B:00.0" -> sysfs' "0000:3b:00.0"."""
    bus_id = bus_id.strip().lower()
    head, _, rest = bus_id.partition(":")
    if rest and len(head) > 4:
        head = head[-4:]
    return f"{head}:{rest}" if rest else bus_id


def nvidia_pci_devices(host: Host) -> list[str]:
    """NVIDIA display/3D controllers on the PCI bus (sysfs vendor 0x10de, class 0x03xxxx)."""
    listing = host.listdir("/sys/bus/pci/devices")
    found: list[str] = []
    for dev in listing.value or []:
        vendor = host.read_value(f"/sys/bus/pci/devices/{dev}/vendor")
        cls = host.read_value(f"/sys/bus/pci/devices/{dev}/class")
        if vendor.value == NVIDIA_VENDOR and (cls.value or "").startswith("0x03"):
            found.append(dev)
    return found


# ------------------------------------------------------------------------------------------------
# NVML (live host)
# ------------------------------------------------------------------------------------------------
_NVML: dict[str, ModuleType] = {}


def _nvml() -> ModuleType:
    """pynvml, initialised once per process; nvmlShutdown runs at exit. Raises ImportError/NVMLError."""
    if "mod" in _NVML:
        return _NVML["mod"]
    import pynvml

    pynvml.nvmlInit()
    _NVML["mod"] = pynvml
    atexit.register(_shutdown)
    return _NVML["mod"]


def _shutdown() -> None:
    mod = _NVML.pop("mod", None)
    if mod is not None:
        with contextlib.suppress(Exception):  # best effort at interpreter exit
            mod.nvmlShutdown()


def _library_missing(host: Host) -> GpuInventory:
    """No libnvidia-ml: no GPU here, unless sysfs shows an NVIDIA device (then the driver is missing)."""
    on_bus = nvidia_pci_devices(host)
    if on_bus:
        return GpuInventory(
            State.ERROR,
            f"an NVIDIA GPU is on the PCI bus ({', '.join(on_bus)}) but the NVML library"
            " (libnvidia-ml.so.1) is not found: the NVIDIA driver is not installed,"
            " or this container was started without the NVIDIA runtime (--gpus all)",
            source="nvml",
        )
    return GpuInventory(State.ABSENT, "no NVIDIA GPU: NVML library not found", source="nvml")


def _init_failure(host: Host, exc: Exception) -> GpuInventory:
    """Turn an NVML init failure into absent (no GPU here) or an error with the reason and fix."""
    import pynvml

    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return _library_missing(host)
    on_bus = nvidia_pci_devices(host)
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return GpuInventory(State.DENIED, f"NVML: permission denied ({exc}); check /dev/nvidia* access")
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded) and not on_bus:
        return GpuInventory(
            State.ABSENT,
            "no NVIDIA GPU: the NVML library is installed but no NVIDIA device is on the PCI bus",
            source="nvml",
        )
    return GpuInventory(
        State.ERROR,
        f"NVML library present but the driver fails: {exc} — check `nvidia-smi`, `lsmod | grep nvidia`"
        " and the kernel log (dmesg | grep NVRM); a driver/library version mismatch needs a reboot",
        source="nvml",
    )


def _call(fn: Callable[..., Any] | None, *args: Any) -> Any:
    """One NVML call; NotSupported, NoPermission, FunctionNotFound and friends read as None."""
    if fn is None:
        return None
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _memory_info(mod: ModuleType, handle: Any) -> Any:
    """Framebuffer memory, ``used`` counted as `nvidia-smi` and dmon's ``fb`` count it.

    The v1 call (nvmlDeviceGetMemoryInfo) counts the driver's reserved memory as used (615 MiB on an
    idle H200 while dmon's fb reads 0); the v2 struct (nvmlMemory_v2, NVML >= 12.535, drivers >= R510)
    reports ``reserved`` apart, so ``used`` is what processes hold. ``free`` is the same in both.
    """
    version = getattr(mod, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return mod.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (TypeError, mod.NVMLError):
            pass  # an older binding or driver: fall back to v1
    return _call(getattr(mod, "nvmlDeviceGetMemoryInfo", None), handle)


def _first(mod: ModuleType, *names: str) -> Callable[..., Any] | None:
    """The first binding function that exists (bindings rename functions across driver releases)."""
    for name in names:
        fn = getattr(mod, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    return None


def _processes(mod: ModuleType, handle: Any) -> tuple[GpuProcess, ...]:
    """Compute then graphics processes: v3 of the call, falling back to v2 and v1 on older drivers."""
    out: dict[int, GpuProcess] = {}
    for kind, base in (
        ("compute", "nvmlDeviceGetComputeRunningProcesses"),
        ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
    ):
        got = None
        for name in (f"{base}_v3", f"{base}_v2", base):
            fn = getattr(mod, name, None)
            if fn is None:
                continue
            try:
                got = fn(handle)
                break
            except mod.NVMLError_FunctionNotFound:
                continue
            except mod.NVMLError:
                break
        for p in got or []:
            used = getattr(p, "usedGpuMemory", None)
            # NVML_VALUE_NOT_AVAILABLE (2**64-1) when the driver cannot attribute memory (containers, WDDM)
            used = used if isinstance(used, int) and used < (1 << 63) else None
            if p.pid not in out:
                out[p.pid] = GpuProcess(int(p.pid), None, used, kind)
    return tuple(out.values())


def _clock_reasons(mod: ModuleType, handle: Any) -> tuple[str, ...]:
    fn = _first(mod, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
    mask = _call(fn, handle)
    return clock_event_names(mask) if isinstance(mask, int) else ()


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_pcie_nvml(index: int) -> PcieLink | None:
    """Re-read one GPU's PCIe link through NVML (the PCIe probe does this under load)."""
    try:
        mod = _nvml()
        handle = mod.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None
    return _pcie(mod, handle)


def _pcie(mod: ModuleType, h: Any) -> PcieLink:
    return PcieLink(
        gen_current=_call(mod.nvmlDeviceGetCurrPcieLinkGeneration, h),
        gen_max=_call(mod.nvmlDeviceGetMaxPcieLinkGeneration, h),
        gen_gpu_max=_call(getattr(mod, "nvmlDeviceGetGpuMaxPcieLinkGeneration", None), h),
        width_current=_call(mod.nvmlDeviceGetCurrPcieLinkWidth, h),
        width_max=_call(mod.nvmlDeviceGetMaxPcieLinkWidth, h),
    )


_ARCH_NAMES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    11: "Orin",
}


def _read_device(mod: ModuleType, host: Host, index: int) -> GpuInfo:
    h = mod.nvmlDeviceGetHandleByIndex(index)
    name = _str(_call(mod.nvmlDeviceGetName, h) or f"GPU {index}")
    pci = _call(mod.nvmlDeviceGetPciInfo, h)
    bus_id = normalize_bus_id(_str(pci.busId)) if pci is not None else ""
    mem = _memory_info(mod, h)
    cc = _call(mod.nvmlDeviceGetCudaComputeCapability, h)
    numa = _call(getattr(mod, "nvmlDeviceGetNumaNodeId", None), h)
    if not isinstance(numa, int) or numa < 0:
        numa = host.read_value(f"/sys/bus/pci/devices/{bus_id}/numa_node").as_int()
        if numa is not None and numa < 0:
            numa = None  # -1 = not reported
    ecc = _call(mod.nvmlDeviceGetEccMode, h)
    mig = _call(getattr(mod, "nvmlDeviceGetMigMode", None), h)
    util = _call(mod.nvmlDeviceGetUtilizationRates, h)
    power = _call(mod.nvmlDeviceGetPowerUsage, h)
    limit = _call(mod.nvmlDeviceGetPowerManagementLimit, h)
    remap = _call(getattr(mod, "nvmlDeviceGetRemappedRows", None), h)
    unc = _call(
        getattr(mod, "nvmlDeviceGetTotalEccErrors", None),
        h,
        getattr(mod, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
        getattr(mod, "NVML_VOLATILE_ECC", 0),
    )
    arch = _call(getattr(mod, "nvmlDeviceGetArchitecture", None), h)
    uuid = _call(mod.nvmlDeviceGetUUID, h)
    persistence = _call(mod.nvmlDeviceGetPersistenceMode, h)
    return GpuInfo(
        index=index,
        name=name,
        uuid=_str(uuid) if uuid is not None else None,
        pci_bus_id=bus_id,
        memory_total=int(mem.total) if mem is not None else 0,
        memory_used=int(mem.used) if mem is not None else 0,
        memory_free=int(mem.free) if mem is not None else 0,
        compute_capability=(int(cc[0]), int(cc[1])) if cc else None,
        compute_capability_source="nvml" if cc else "",
        pcie=_pcie(mod, h),
        numa_node=numa,
        processes=_processes(mod, h),
        persistence_mode=bool(persistence) if persistence is not None else None,
        ecc_enabled=bool(ecc[0]) if ecc else None,
        mig_enabled=bool(mig[0]) if mig else None,
        utilization_gpu=int(util.gpu) if util is not None else None,
        power_draw_w=power / 1000 if isinstance(power, int) else None,
        power_limit_w=limit / 1000 if isinstance(limit, int) else None,
        temperature_c=_call(mod.nvmlDeviceGetTemperature, h, getattr(mod, "NVML_TEMPERATURE_GPU", 0)),
        clock_sm_mhz=_call(mod.nvmlDeviceGetClockInfo, h, mod.NVML_CLOCK_SM),
        clock_sm_max_mhz=_call(mod.nvmlDeviceGetMaxClockInfo, h, mod.NVML_CLOCK_SM),
        throttle_reasons=_clock_reasons(mod, h),
        remapped_rows_pending=bool(remap[2]) if remap else None,
        remapped_rows_failed=bool(remap[3]) if remap else None,
        ecc_uncorrected_volatile=unc if isinstance(unc, int) else None,
        architecture=_ARCH_NAMES.get(arch) if isinstance(arch, int) else None,
    )


def read_nvml(host: Host) -> GpuInventory:
    """Every GPU through NVML. Never raises: a missing library or a broken driver is a state + reason."""
    if "mod" not in _NVML:
        import ctypes

        try:  # what nvmlInit loads first; failing here spares importing the binding on GPU-less hosts
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return _library_missing(host)
    try:
        import pynvml  # noqa: F401 - only to tell "binding missing" from "library missing"
    except ImportError:
        return GpuInventory(State.ABSENT, "no NVIDIA GPU support: the nvidia-ml-py package is not installed")
    try:
        mod = _nvml()
    except Exception as exc:
        return _init_failure(host, exc)
    try:
        driver = _str(mod.nvmlSystemGetDriverVersion())
        cuda = _call(_first(mod, "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"))
        count = mod.nvmlDeviceGetCount()
        gpus = tuple(_read_device(mod, host, i) for i in range(count))
    except mod.NVMLError as exc:
        return GpuInventory(State.ERROR, f"NVML failed while reading the GPUs: {exc}", source="nvml")
    if not gpus:
        return GpuInventory(State.ABSENT, "no NVIDIA GPU: NVML sees 0 devices", driver, None, (), "nvml")
    return GpuInventory(
        State.OK,
        "",
        driver,
        (cuda // 1000, (cuda % 1000) // 10) if isinstance(cuda, int) else None,
        gpus,
        "nvml",
    )


# ------------------------------------------------------------------------------------------------
# nvidia-smi -q -x (snapshots)
# ------------------------------------------------------------------------------------------------
_NA = {
    "",
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "unknown",
    "none",
    "requested functionality has been deprecated",
    "insufficient permissions",
}
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def _xml_text(el: ElementTree.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text.lower() in _NA else text


def _xml_num(el: ElementTree.Element | None, path: str) -> float | None:
    """The number in a value like "143771 MiB", "16x", "126.50 W", "38 C"; None for N/A."""
    text = _xml_text(el, path)
    m = _NUM.search(text) if text else None
    return float(m.group()) if m else None


def _xml_int(el: ElementTree.Element | None, *paths: str) -> int | None:
    for path in paths:
        value = _xml_num(el, path)
        if value is not None:
            return int(value)
    return None


def _xml_mib(el: ElementTree.Element | None, path: str) -> int | None:
    value = _xml_num(el, path)
    return int(value * MIB) if value is not None else None


def _xml_flag(el: ElementTree.Element | None, path: str) -> bool | None:
    text = (_xml_text(el, path) or "").lower()
    if text in ("enabled", "yes", "active", "true"):
        return True
    if text in ("disabled", "no", "not active", "false"):
        return False
    return None


def _smi_reasons(gpu: ElementTree.Element) -> tuple[str, ...]:
    """Active <clocks_event_reasons> (driver >= 535) or <clocks_throttle_reasons> (older)."""
    active: list[str] = []
    for block, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        for child in gpu.find(block) if gpu.find(block) is not None else []:  # type: ignore[union-attr]
            if (child.text or "").strip().lower() == "active":
                name = child.tag.removeprefix(prefix)
                if name not in active:
                    active.append(name)
    return tuple(active)


def _smi_uncorrected(gpu: ElementTree.Element) -> int | None:
    """Volatile uncorrectable ECC errors: sum of *uncorrectable* counters (new XML), else double_bit/total."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    values = [_xml_num(volatile, c.tag) for c in volatile if "uncorrectable" in c.tag]
    if not values:
        values = [_xml_num(volatile, "double_bit/total")]
    known = [int(v) for v in values if v is not None]
    return sum(known) if known else None


def _smi_processes(gpu: ElementTree.Element) -> tuple[GpuProcess, ...]:
    out: list[GpuProcess] = []
    for p in gpu.findall("processes/process_info"):
        pid = _xml_int(p, "pid")
        if pid is None:
            continue
        kind = "graphics" if (_xml_text(p, "type") or "C").upper() == "G" else "compute"
        out.append(GpuProcess(pid, _xml_text(p, "process_name"), _xml_mib(p, "used_memory"), kind))
    return tuple(out)


def _smi_gpu(index: int, gpu: ElementTree.Element) -> GpuInfo:
    name = _xml_text(gpu, "product_name") or f"GPU {index}"
    arch = _xml_text(gpu, "product_architecture")
    link = gpu.find("pci/pci_gpu_link_info")
    pcie = None
    if link is not None:
        pcie = PcieLink(
            gen_current=_xml_int(link, "pcie_gen/current_link_gen"),
            gen_max=_xml_int(link, "pcie_gen/max_link_gen"),
            gen_gpu_max=_xml_int(link, "pcie_gen/max_device_link_gen"),
            width_current=_xml_int(link, "link_widths/current_link_width"),
            width_max=_xml_int(link, "link_widths/max_link_width"),
        )
    cc = compute_capability_from_name(name, arch)
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    return GpuInfo(
        index=index,
        name=name,
        uuid=_xml_text(gpu, "uuid"),
        pci_bus_id=normalize_bus_id(_xml_text(gpu, "pci/pci_bus_id") or gpu.get("id") or ""),
        memory_total=_xml_mib(gpu, "fb_memory_usage/total") or 0,
        memory_used=_xml_mib(gpu, "fb_memory_usage/used") or 0,
        memory_free=_xml_mib(gpu, "fb_memory_usage/free") or 0,
        compute_capability=cc,
        compute_capability_source="product name" if cc else "",
        pcie=pcie,
        numa_node=None,
        processes=_smi_processes(gpu),
        persistence_mode=_xml_flag(gpu, "persistence_mode"),
        ecc_enabled=_xml_flag(gpu, "ecc_mode/current_ecc"),
        mig_enabled=_xml_flag(gpu, "mig_mode/current_mig"),
        utilization_gpu=_xml_int(gpu, "utilization/gpu_util"),
        power_draw_w=_xml_num(power, "instant_power_draw") or _xml_num(power, "power_draw"),
        power_limit_w=_xml_num(power, "current_power_limit") or _xml_num(power, "power_limit"),
        temperature_c=_xml_int(gpu, "temperature/gpu_temp"),
        clock_sm_mhz=_xml_int(gpu, "clocks/sm_clock"),
        clock_sm_max_mhz=_xml_int(gpu, "max_clocks/sm_clock"),
        throttle_reasons=_smi_reasons(gpu),
        remapped_rows_pending=_xml_flag(gpu, "remapped_rows/remapped_row_pending"),
        remapped_rows_failed=_xml_flag(gpu, "remapped_rows/remapped_row_failure"),
        ecc_uncorrected_volatile=_smi_uncorrected(gpu),
        architecture=arch,
    )


def parse_smi_xml(text: str) -> GpuInventory:
    """Parse the output of ``nvidia-smi -q -x``. Pure: garbage gives an ERROR inventory, never raises."""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(text)
    except (ElementTree.ParseError, ValueError) as exc:
        return GpuInventory(State.ERROR, f"nvidia-smi.xml is not valid XML: {exc}", source=NVIDIA_SMI_XML)
    if root.tag != "nvidia_smi_log":
        reason = f"nvidia-smi.xml: unexpected root <{root.tag}>"
        return GpuInventory(State.ERROR, reason, source=NVIDIA_SMI_XML)
    cuda_text = _xml_text(root, "cuda_version") or ""
    m = re.fullmatch(r"(\d+)\.(\d+)", cuda_text)
    cuda = (int(m.group(1)), int(m.group(2))) if m else None
    gpus = tuple(_smi_gpu(i, g) for i, g in enumerate(root.findall("gpu")))
    driver = _xml_text(root, "driver_version")
    if not gpus:
        return GpuInventory(
            State.ABSENT, "no NVIDIA GPU: nvidia-smi.xml lists no GPU", driver, cuda, (), NVIDIA_SMI_XML
        )
    return GpuInventory(State.OK, "", driver, cuda, gpus, NVIDIA_SMI_XML)


# ------------------------------------------------------------------------------------------------
# nvml.json (written by `gputune snapshot`): the NVML inventory as JSON
# ------------------------------------------------------------------------------------------------
def inventory_to_json(inv: GpuInventory) -> dict[str, Any]:
    data = dataclasses.asdict(inv)
    data["state"] = inv.state.value
    data["schema"] = 1
    return data


def _tuple2(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (value[0], value[1])
    return None


def _gpu_from_json(d: dict[str, Any]) -> GpuInfo:
    fields = {f.name for f in dataclasses.fields(GpuInfo)}
    kw = {k: v for k, v in d.items() if k in fields}
    pcie = d.get("pcie")
    pcie_fields = {f.name for f in dataclasses.fields(PcieLink)}
    kw["pcie"] = PcieLink(**{k: pcie.get(k) for k in pcie_fields}) if isinstance(pcie, dict) else None
    kw["processes"] = tuple(
        GpuProcess(int(p["pid"]), p.get("name"), p.get("used_bytes"), p.get("kind", "compute"))
        for p in d.get("processes") or []
    )
    kw["compute_capability"] = _tuple2(d.get("compute_capability"))
    kw["throttle_reasons"] = tuple(d.get("throttle_reasons") or ())
    return GpuInfo(**kw)


def inventory_from_json(data: dict[str, Any]) -> GpuInventory:
    """Read back :func:`inventory_to_json`. Raises KeyError/TypeError/ValueError on a malformed file."""
    gpus = tuple(_gpu_from_json(g) for g in data.get("gpus") or [])
    return GpuInventory(
        State(data["state"]),
        str(data.get("reason", "")),
        data.get("driver_version"),
        _tuple2(data.get("cuda_driver_version")),
        gpus,
        NVML_JSON,
    )


def _merge(xml: GpuInfo, nvml: GpuInfo) -> GpuInfo:
    """Fill from NVML what nvidia-smi's XML lacks: compute capability, the GPU's own max gen, NUMA node."""
    changes: dict[str, Any] = {}
    if nvml.compute_capability:
        changes["compute_capability"] = nvml.compute_capability
        changes["compute_capability_source"] = NVML_JSON
    if xml.numa_node is None and nvml.numa_node is not None:
        changes["numa_node"] = nvml.numa_node
    if xml.pcie is not None and nvml.pcie is not None and xml.pcie.gen_gpu_max is None:
        changes["pcie"] = dataclasses.replace(xml.pcie, gen_gpu_max=nvml.pcie.gen_gpu_max)
    elif xml.pcie is None and nvml.pcie is not None:
        changes["pcie"] = nvml.pcie
    names = {p.pid: p.name for p in nvml.processes if p.name}
    if names and any(p.name is None for p in xml.processes):
        changes["processes"] = tuple(
            dataclasses.replace(p, name=p.name or names.get(p.pid)) for p in xml.processes
        )
    return dataclasses.replace(xml, **changes) if changes else xml


def _merge_all(xml: GpuInventory, nvml: GpuInventory) -> GpuInventory:
    by_bus = {g.pci_bus_id: g for g in nvml.gpus}
    merged = tuple(_merge(g, by_bus[g.pci_bus_id]) if g.pci_bus_id in by_bus else g for g in xml.gpus)
    cuda = xml.cuda_driver_version or nvml.cuda_driver_version
    return dataclasses.replace(xml, gpus=merged, cuda_driver_version=cuda)


def read_snapshot(host: Host) -> GpuInventory:
    """A snapshot's GPUs: ``nvidia-smi.xml`` (absent = no GPU), completed from ``nvml.json`` when present."""
    xml_path = host.extra(NVIDIA_SMI_XML)
    try:
        text = xml_path.read_bytes()[: 64 << 20].decode("utf-8", errors="replace")
    except FileNotFoundError:
        return GpuInventory(State.ABSENT, f"no {NVIDIA_SMI_XML} in snapshot (no NVIDIA GPU recorded)")
    except OSError as exc:
        return GpuInventory(State.ERROR, f"{NVIDIA_SMI_XML}: {exc.strerror or exc}", source=NVIDIA_SMI_XML)
    inv = parse_smi_xml(text)
    if inv.state is not State.OK:
        return inv
    try:
        nvml = inventory_from_json(json.loads(host.extra(NVML_JSON).read_text(errors="replace")))
    except (OSError, ValueError, KeyError, TypeError):
        return inv  # nvml.json is optional; a broken one must not hide the XML's facts
    return _merge_all(inv, nvml)


# ==================================================================================================
# Telemetry sampling (used by tuner.telemetry's recorder; separate from the inventory readers above)
#
# A light, repeatable read of the numbers that change while a server runs, through the same
# adapter (``_nvml()`` above), keeping the device handles between samples.
# ==================================================================================================


# nvmlClocksEventReason* bits (nvml.h; nvmlClocksThrottleReason* before driver 535); the names are
# nvidia-smi's XML tags without their prefix.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clocks_setting",
}


def clock_event_names(mask: int) -> tuple[str, ...]:
    """Names of the bits set in an NVML clock-event (throttle) reason mask."""
    return tuple(name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit)


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU; ``None`` where NVML did not report the value."""

    time: float  # Unix seconds when the sample was taken
    index: int
    mem_used_mib: float | None  # nvmlDeviceGetMemoryInfo(v2).used / 2**20 (nvidia-smi dmon "fb")
    mem_total_mib: float | None  # nvmlDeviceGetMemoryInfo.total / 2**20
    util_gpu: int | None  # nvmlDeviceGetUtilizationRates.gpu, percent (dmon "sm")
    util_mem: int | None  # nvmlDeviceGetUtilizationRates.memory, percent (dmon "mem")
    power_w: float | None  # nvmlDeviceGetPowerUsage, mW -> W (dmon "pwr")
    temp_c: int | None  # nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU) (dmon "gtemp")
    sm_clock_mhz: int | None  # nvmlDeviceGetClockInfo(NVML_CLOCK_SM) (dmon "pclk")
    throttle: tuple[str, ...]  # nvmlDeviceGetCurrentClocksEventReasons, by name
    pcie_tx_kbs: int | None  # nvmlDeviceGetPcieThroughput(TX), KB/s over a 20 ms window (dmon "txpci")
    pcie_rx_kbs: int | None  # nvmlDeviceGetPcieThroughput(RX), KB/s
    processes: tuple[GpuProcess, ...] | None = None  # compute+graphics processes; None: not read this time


class NvmlSampler:
    """Repeated NVML reads for the telemetry recorder.

    ``nvml`` is the binding module; by default the shared, lazily initialised one of this adapter.
    Tests pass a stand-in built from captured NVML readings. PCIe throughput costs a 20 ms
    measurement window per call and the process list a walk of the driver's tables, so both are
    read at most every ``slow_every`` seconds and repeated from the last read in between.
    """

    def __init__(self, nvml: ModuleType | None = None, slow_every: float = 1.0) -> None:
        self._mod: ModuleType | None = nvml
        self._handles: list[Any] = []
        self._opened = False
        self.reason = ""
        self.slow_every = slow_every
        self._slow_at = -1e18
        self._slow: dict[int, tuple[int | None, int | None, tuple[GpuProcess, ...]]] = {}
        self._names: dict[int, str | None] = {}

    def open(self) -> bool:
        """Initialise NVML; False (with ``reason``) when there is no binding, no driver or no GPU."""
        if self._opened:
            return bool(self._handles)
        self._opened = True
        try:
            if self._mod is None:
                self._mod = _nvml()
            else:
                self._mod.nvmlInit()
            count = int(self._mod.nvmlDeviceGetCount())
            self._handles = [self._mod.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except ImportError:
            self.reason = "the NVML binding (nvidia-ml-py) is not installed"
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML is not available: {exc}"
        if not self._handles and not self.reason:
            self.reason = "NVML sees no GPU"
        return bool(self._handles)

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def _process_name(self, pid: int) -> str | None:
        if pid not in self._names:
            try:
                import psutil

                self._names[pid] = psutil.Process(pid).name()
            except Exception:  # gone, or not ours to see
                self._names[pid] = None
        return self._names[pid]

    def _read_slow(self, h: Any) -> tuple[int | None, int | None, tuple[GpuProcess, ...]]:
        assert self._mod is not None
        fn = getattr(self._mod, "nvmlDeviceGetPcieThroughput", None)
        tx = _call(fn, h, 0)  # NVML_PCIE_UTIL_TX_BYTES
        rx = _call(fn, h, 1)  # NVML_PCIE_UTIL_RX_BYTES
        procs = tuple(
            dataclasses.replace(p, name=self._process_name(p.pid)) for p in _processes(self._mod, h)
        )
        return (_as_int(tx), _as_int(rx), procs)

    def sample(self, now: float, monotonic: float) -> list[GpuSample]:
        """One sample per GPU; never raises (a lost GPU gives a row of empty fields)."""
        mod = self._mod
        if mod is None:
            return []
        slow_due = monotonic - self._slow_at >= self.slow_every
        if slow_due:
            self._slow_at = monotonic
        out: list[GpuSample] = []
        for i, h in enumerate(self._handles):
            mem = _memory_info(mod, h)
            util = _call(getattr(mod, "nvmlDeviceGetUtilizationRates", None), h)
            power = _call(getattr(mod, "nvmlDeviceGetPowerUsage", None), h)
            temp = _call(getattr(mod, "nvmlDeviceGetTemperature", None), h, 0)  # NVML_TEMPERATURE_GPU
            clock = _call(getattr(mod, "nvmlDeviceGetClockInfo", None), h, 1)  # NVML_CLOCK_SM
            fresh = slow_due or i not in self._slow
            if fresh:
                self._slow[i] = self._read_slow(h)
            tx, rx, procs = self._slow[i]
            out.append(
                GpuSample(
                    time=now,
                    index=i,
                    mem_used_mib=_as_mib(getattr(mem, "used", None)),
                    mem_total_mib=_as_mib(getattr(mem, "total", None)),
                    util_gpu=_as_int(getattr(util, "gpu", None)),
                    util_mem=_as_int(getattr(util, "memory", None)),
                    power_w=power / 1000.0 if isinstance(power, (int, float)) else None,
                    temp_c=_as_int(temp),
                    sm_clock_mhz=_as_int(clock),
                    throttle=_clock_reasons(mod, h),
                    pcie_tx_kbs=tx,
                    pcie_rx_kbs=rx,
                    processes=procs if fresh else None,
                )
            )
        return out


def _as_mib(v: object) -> float | None:
    return round(v / MIB, 1) if isinstance(v, (int, float)) else None


def _as_int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) else None

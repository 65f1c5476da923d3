"""CPU facts: model, ISA flags, and the cpufreq governor and driver of every CPU.

Sources (all through the host root):
- ``/proc/cpuinfo``: "model name" / "vendor_id" / "flags" (x86), "Features" / "CPU part" (Arm);
- ``/sys/devices/system/cpu/cpufreq/policyN/{scaling_governor,scaling_driver,affected_cpus}``,
  or ``/sys/devices/system/cpu/cpuN/cpufreq/...`` on kernels without policy directories;
  absent in most virtual machines (the hypervisor owns frequency scaling);
- ``/sys/devices/system/cpu/intel_pstate/status``, ``/sys/devices/system/cpu/amd_pstate/status``.

py-cpuinfo (``cpuinfo.get_cpu_info``) runs CPUID itself but costs about a second, so it is used
only on the live host and only when ``Facts(..., cpu_deep=True)`` asks for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.host import Host, State
from tuner.probes.numa import format_cpulist, parse_cpulist

if TYPE_CHECKING:
    from tuner.probes import Facts

CPU_ROOT = "/sys/devices/system/cpu"

# ISA extensions that decide CPU-offload speed and whether the CPU build of vLLM runs fast.
ISA_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    # Arm (Features line)
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)
_CPU_DIR = re.compile(r"cpu(\d+)$")
_POLICY_DIR = re.compile(r"policy(\d+)$")


@dataclass(frozen=True)
class CpuFreq:
    cpu: int  # N of cpuN
    governor: str | None  # cpufreq/scaling_governor ("performance", "powersave", "ondemand", ...)
    driver: str | None  # cpufreq/scaling_driver ("intel_pstate", "acpi-cpufreq", "amd-pstate-epp", ...)
    max_khz: int | None = None  # cpufreq/scaling_max_freq
    hw_max_khz: int | None = None  # cpufreq/cpuinfo_max_freq


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo says (pure parse result)."""

    model: str | None  # "model name" (x86), "Model"/"CPU part" (Arm)
    vendor: str | None  # "vendor_id" (x86), "CPU implementer" (Arm)
    logical_cpus: int  # number of "processor" entries
    flags: frozenset[str]  # "flags" (x86) or "Features" (Arm) of the first processor


@dataclass(frozen=True)
class CpuFacts:
    model: str | None
    vendor: str | None
    logical_cpus: int | None
    flags: frozenset[str]
    isa: tuple[str, ...]  # the ISA_FLAGS this CPU has, in ISA_FLAGS order
    cpuinfo_reason: str  # why model/flags are missing, "" when /proc/cpuinfo was read
    freq: tuple[CpuFreq, ...]  # per CPU; empty without cpufreq
    freq_state: State  # OK, ABSENT (no cpufreq: a VM, or no driver), DENIED, ERROR
    freq_reason: str
    pstate: dict[str, str]  # {"intel_pstate": "active"} from .../intel_pstate/status, amd_pstate/status
    online: str | None  # /sys/devices/system/cpu/online, cpulist notation
    deep: dict[str, Any] | None = None  # py-cpuinfo's answer when asked for (live host only)

    def governors(self) -> dict[str, str]:
        """governor -> the CPUs using it, in cpulist notation ("powersave": "0-7")."""
        groups: dict[str, list[int]] = {}
        for f in self.freq:
            groups.setdefault(f.governor or "unknown", []).append(f.cpu)
        return {g: format_cpulist(cpus) for g, cpus in sorted(groups.items())}

    def drivers(self) -> tuple[str, ...]:
        return tuple(sorted({f.driver for f in self.freq if f.driver}))


def parse_cpuinfo(text: str) -> CpuInfo:
    """Parse /proc/cpuinfo. Unknown or malformed lines are ignored; never raises."""
    model = vendor = None
    flags: frozenset[str] | None = None
    processors = 0
    arm_part = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip().lower(), value.strip()
        if key == "processor":
            processors += 1
        elif key == "model name" and model is None and value:
            model = value
        elif key in ("vendor_id", "cpu implementer") and vendor is None and value:
            vendor = value
        elif key in ("flags", "features") and flags is None:
            flags = frozenset(value.split())
        elif key == "model" and model is None and value and not value.isdigit():
            model = value  # Arm/Raspberry Pi "Model : ..." line; x86 "model : 143" is a number
        elif key == "cpu part" and arm_part is None:
            arm_part = value
    if model is None and arm_part:
        model = f"Arm CPU part {arm_part}"
    return CpuInfo(model, vendor, processors, flags or frozenset())


def _text(host: Host, path: str) -> str | None:
    r = host.read_value(path)
    return r.value if r.ok and r.value else None


def _freq_of(host: Host, base: str, cpu: int) -> CpuFreq:
    return CpuFreq(
        cpu=cpu,
        governor=_text(host, f"{base}/scaling_governor"),
        driver=_text(host, f"{base}/scaling_driver"),
        max_khz=host.read_value(f"{base}/scaling_max_freq").as_int(),
        hw_max_khz=host.read_value(f"{base}/cpuinfo_max_freq").as_int(),
    )


def read_cpufreq(host: Host) -> tuple[tuple[CpuFreq, ...], State, str]:
    """Governor and driver per CPU, from cpufreq policies (or per-CPU cpufreq directories)."""
    per_cpu: dict[int, CpuFreq] = {}
    policies = host.listdir(f"{CPU_ROOT}/cpufreq")
    for name in policies.value or []:
        if not _POLICY_DIR.match(name):
            continue
        base = f"{CPU_ROOT}/cpufreq/{name}"
        cpus_r = host.read_value(f"{base}/affected_cpus")
        if not cpus_r.ok:
            cpus_r = host.read_value(f"{base}/related_cpus")
        try:
            # affected_cpus is space separated ("0 1 2"), related_cpus too; accept both notations
            cpus = parse_cpulist(",".join((cpus_r.value or "").split())) if cpus_r.ok else ()
        except ValueError:
            cpus = ()
        if not cpus:
            m = _POLICY_DIR.match(name)
            cpus = (int(m.group(1)),) if m else ()
        for cpu in cpus:
            f = _freq_of(host, base, cpu)
            if f.governor is not None or f.driver is not None:
                per_cpu[cpu] = f
    listing = host.listdir(CPU_ROOT)
    if listing.state is State.ABSENT:
        return (), State.ABSENT, f"no cpufreq ({CPU_ROOT} is missing)"
    if not listing.ok:
        return (), listing.state, listing.reason or f"{CPU_ROOT} unreadable"
    denied = ""
    for name in listing.value or []:
        m = _CPU_DIR.match(name)
        if not m or int(m.group(1)) in per_cpu:
            continue
        base = f"{CPU_ROOT}/{name}/cpufreq"
        gov = host.read_value(f"{base}/scaling_governor")
        if gov.state is State.DENIED:
            denied = gov.reason
        if gov.ok or host.read_value(f"{base}/scaling_driver").ok:
            per_cpu[int(m.group(1))] = _freq_of(host, base, int(m.group(1)))
    if per_cpu:
        return tuple(per_cpu[c] for c in sorted(per_cpu)), State.OK, ""
    if denied:
        return (), State.DENIED, denied
    return (), State.ABSENT, "no cpufreq (a VM, or no frequency-scaling driver loaded)"


def _deep_cpuinfo() -> dict[str, Any] | None:
    """py-cpuinfo's full probe (about a second): live host only, on request."""
    try:
        import cpuinfo
    except ImportError:
        return None
    try:
        info = cpuinfo.get_cpu_info()
    except Exception:  # py-cpuinfo runs CPUID helpers that may fail in odd sandboxes
        return None
    return {
        k: info.get(k)
        for k in ("brand_raw", "vendor_id_raw", "arch", "count", "flags", "hz_advertised_friendly")
    }


def probe(facts: Facts) -> CpuFacts:
    host = facts.host
    r = host.read_text("/proc/cpuinfo", limit=16 << 20)
    info = parse_cpuinfo(r.value) if r.ok and r.value is not None else CpuInfo(None, None, 0, frozenset())
    reason = "" if r.ok else (r.reason or "/proc/cpuinfo unreadable")
    deep = _deep_cpuinfo() if host.live and facts.options.get("cpu_deep") else None
    flags = info.flags
    model = info.model
    if deep:
        flags = flags | frozenset(str(f) for f in deep.get("flags") or ())
        model = model or (str(deep["brand_raw"]) if deep.get("brand_raw") else None)
    freq, state, freason = read_cpufreq(host)
    pstate = {}
    for drv in ("intel_pstate", "amd_pstate"):
        status = _text(host, f"{CPU_ROOT}/{drv}/status")
        if status:
            pstate[drv] = status
    return CpuFacts(
        model=model,
        vendor=info.vendor,
        logical_cpus=info.logical_cpus or None,
        flags=flags,
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        cpuinfo_reason=reason,
        freq=freq,
        freq_state=state,
        freq_reason=freason,
        pstate=pstate,
        online=_text(host, f"{CPU_ROOT}/online"),
        deep=deep,
    )

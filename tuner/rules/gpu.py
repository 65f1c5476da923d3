"""Rules for the GPU checks in checks/gpu.toml: pcie.link, driver.cuda, gpu.processes, gpu.persistence,
gpu.ecc, gpu.throttle, gpu.mig, gpu.compute_capability.

Facts come from tuner/probes/gpu.py (NVML / nvidia-smi.xml), pcie.py (NVML + sysfs) and
software.py (package metadata). Each per-GPU check gives one finding per GPU (subject "gpu0", ...);
without a GPU each gives one ``skip`` with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.gpu import GpuInfo, GpuInventory
from tuner.host import State
from tuner.probes import Facts
from tuner.probes.pcie import GpuLink, PcieFacts
from tuner.probes.software import SoftwareFacts

GIB = 1 << 30
MIB = 1 << 20
VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default (EngineArgs.gpu_memory_utilization)

# Usable bandwidth per lane and direction in GB/s, after line encoding (8b/10b up to Gen2, 128b/130b after).
GB_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

# Driver needed by each CUDA toolkit release on Linux x86_64 (the GA "Toolkit Driver Version"), from
# NVIDIA's CUDA Toolkit Release Notes, table "CUDA Toolkit and Corresponding Driver Versions":
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# Minimum driver branch of a CUDA major version under minor-version compatibility, from
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html (table 1):
# CUDA 13.x >= 580, 12.x >= 525 (< 580), 11.x >= 450 (< 525).
MAJOR_MIN_BRANCH = {11: 450, 12: 525, 13: 580}
# CUDA versions download.pytorch.org publishes recent torch wheels for (whl/cuXYZ); a wheel runs on any
# driver of its CUDA major version through minor-version compatibility.
TORCH_CUDA_TAGS = ((11, 8), (12, 6), (12, 8), (12, 9), (13, 0))


def bandwidth(gen: int | None, width: int | None) -> float | None:
    """GB/s per direction of a link; None when either side is unknown."""
    if gen is None or width is None or gen not in GB_PER_LANE:
        return None
    return round(GB_PER_LANE[gen] * width, 1)


def _skip_no_gpu(check: CheckDef, inv: GpuInventory) -> Finding:
    """No usable GPU: skip with the reason (a broken driver is driver.cuda's failure, reported once)."""
    return check.finding(Status.SKIP, inv.reason or "no NVIDIA GPU", {"gpu_state": inv.state.value})


def _subject(g: GpuInfo | GpuLink) -> str:
    return f"gpu{g.index}"


# ------------------------------------------------------------------------------------------------
# pcie.link
# ------------------------------------------------------------------------------------------------
def _link_evidence(link: GpuLink) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "gpu": link.name,
        "pci_bus_id": link.pci_bus_id,
        "nvml": asdict(link.nvml) if link.nvml else None,
        "sysfs": asdict(link.sysfs) if link.sysfs else None,
        "utilization_gpu_pct": link.utilization_gpu,
        "clock_sm_mhz": link.clock_sm_mhz,
        "clock_sm_max_mhz": link.clock_sm_max_mhz,
        "gpu_idle_reason_active": link.idle_reason_active,
    }
    if link.under_load is not None:
        ev["under_load"] = asdict(link.under_load)
    return ev


def _pick(*values: int | None) -> int | None:
    return next((v for v in values if v is not None), None)


def judge_link(check: CheckDef, link: GpuLink) -> Finding:
    nv, sy = link.nvml, link.sysfs
    cur_gen = _pick(nv.gen_current if nv else None, sy.gen_current if sy else None)
    cur_w = _pick(nv.width_current if nv else None, sy.width_current if sy else None)
    sys_cap = min((g for g in (sy.gen_max, sy.slot_gen_max) if g is not None), default=None) if sy else None
    max_gen = _pick(nv.gen_max if nv else None, sys_cap)
    gpu_gen = _pick(nv.gen_gpu_max if nv else None, sy.gen_max if sy else None, max_gen)
    max_w = _pick(nv.width_max if nv else None, sy.width_max if sy else None)
    ev = _link_evidence(link)
    subject = _subject(link)
    if cur_gen is None and cur_w is None:
        return check.finding(
            Status.SKIP, "the PCIe link is not reported (NVML and sysfs)", ev, subject=subject
        )

    retest = link.under_load
    loaded = False
    if retest is not None and retest.ran:
        loaded = True
        rn, rs = retest.nvml, retest.sysfs
        cur_gen = _pick(rn.gen_current if rn else None, rs.gen_current if rs else None, cur_gen)
        cur_w = _pick(rn.width_current if rn else None, rs.width_current if rs else None, cur_w)
    elif link.utilization_gpu is not None and link.utilization_gpu > 0 and not link.idle_reason_active:
        loaded = True
    # At idle the current generation says nothing about what the link can do: judge the trained maximum.
    eff_gen = cur_gen if loaded else max_gen
    full = bandwidth(gpu_gen, max_w)
    got = bandwidth(eff_gen, cur_w)
    ev["bandwidth_gb_s_per_direction"] = {"possible": full, "now" if loaded else "at_max_gen": got}

    problems: list[str] = []
    causes: list[str] = []
    if cur_w is not None and max_w is not None and cur_w < max_w:
        problems.append(f"x{cur_w} of x{max_w} lanes")
        causes += [
            "a slot wired x8/x4 (many boards split x16 when a second slot or M.2 is used)",
            "a riser or extender cable",
            "dirt or a badly seated card (link training)",
        ]
    if max_gen is not None and gpu_gen is not None and max_gen < gpu_gen:
        problems.append(f"the slot/host caps the link at Gen{max_gen} (the GPU supports Gen{gpu_gen})")
        causes += ["an older slot/CPU/chipset root port", f"the BIOS slot speed set below Gen{gpu_gen}"]
    if loaded and cur_gen is not None and max_gen is not None and cur_gen < max_gen:
        problems.append(f"Gen{cur_gen} under load (max Gen{max_gen})")
        causes += [
            "the BIOS PCIe speed setting (forced Gen3/Gen1 or Auto misbehaving)",
            "link training falling back on a marginal riser or slot",
        ]
    if problems:
        lost = (
            f"~{full - got:.1f} GB/s per direction lost ({got} of {full} GB/s)"
            if full is not None and got is not None
            else "bandwidth lost unknown"
        )
        ev["bandwidth_lost_gb_s"] = round(full - got, 1) if full is not None and got is not None else None
        summary = f"Gen{cur_gen} x{cur_w} where Gen{gpu_gen} x{max_w} is possible: " + "; ".join(problems)
        summary += f" — {lost}"
        uniq = list(dict.fromkeys(causes))
        return check.finding(
            Status.FAIL,
            summary,
            ev,
            "degraded",
            subject,
            problems="; ".join(problems),
            lost=lost,
            causes=", ".join(uniq),
            gen=gpu_gen,
            bus=link.pci_bus_id,
        )
    now = f"Gen{cur_gen} x{cur_w}"
    if cur_gen is not None and max_gen is not None and cur_gen < max_gen:
        util = (
            f"utilization {link.utilization_gpu} %"
            if link.utilization_gpu is not None
            else "utilization unknown"
        )
        clocks = f", SM clock {link.clock_sm_mhz}/{link.clock_sm_max_mhz} MHz" if link.clock_sm_mhz else ""
        why = ""
        if retest is not None and not retest.ran:
            why = f"; the load re-test did not run: {retest.reason}"
        summary = (
            f"{now} now, Gen{max_gen} x{max_w} max: the GPU was idle ({util}{clocks}) and links drop speed"
            f" at idle to save power; not a fault. Re-check under load: `gputune doctor --under-load`{why}"
        )
        return check.finding(Status.PASS, summary, ev, "recheck", subject)
    how = " under load" if retest is not None and retest.ran else ""
    summary = f"{now}{how} (max Gen{max_gen} x{max_w}), ~{got} GB/s per direction"
    return check.finding(Status.PASS, summary, ev, subject=subject)


@rule("pcie.link")
def pcie_link(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    pf: PcieFacts = facts.get("pcie")
    if pf.state is not State.OK:
        yield _skip_no_gpu(check, facts.get("gpu"))
        return
    for link in pf.links:
        yield judge_link(check, link)


# ------------------------------------------------------------------------------------------------
# driver.cuda
# ------------------------------------------------------------------------------------------------
def _ver(v: tuple[int, int] | None) -> str:
    return f"{v[0]}.{v[1]}" if v else "unknown"


def branch_for(cuda: tuple[int, int]) -> tuple[int, str]:
    """(driver branch, toolkit driver version) that fully supports CUDA ``cuda`` (nearest known release)."""
    known = [k for k in TOOLKIT_DRIVER if k[0] == cuda[0] and k <= cuda]
    if known:
        ver = TOOLKIT_DRIVER[max(known)]
        return int(ver.split(".")[0]), ver
    base = MAJOR_MIN_BRANCH.get(cuda[0], 580)
    return base, f"{base}"


def cu_tag(cuda: tuple[int, int] | None) -> str:
    """The wheel index for a driver's CUDA: the newest tag of its major version not newer than it, else
    the oldest of that major (runs through minor-version compatibility); "cu126" for (12, 2)."""
    if cuda is None:
        tag = TORCH_CUDA_TAGS[-1]
    else:
        same = [t for t in TORCH_CUDA_TAGS if t[0] == cuda[0]]
        fits = [t for t in same if t <= cuda]
        older = [t for t in TORCH_CUDA_TAGS if t <= cuda]
        tag = max(fits) if fits else min(same) if same else max(older) if older else TORCH_CUDA_TAGS[0]
    return f"cu{tag[0]}{tag[1]}"


def _software_evidence(sw: SoftwareFacts) -> dict[str, Any]:
    return {
        "driver_version": sw.driver_version,
        "driver_cuda": _ver(sw.cuda_driver_version) if sw.cuda_driver_version else None,
        "torch": sw.torch.version if sw.torch else "not installed",
        "torch_cuda": (_ver(sw.torch_cuda) if sw.torch_cuda else "cpu build" if sw.torch_cpu_build else None),
        "torch_cuda_source": sw.torch_cuda_source or None,
        "vllm": f"{sw.vllm.name} {sw.vllm.version}" if sw.vllm else "not installed",
        "vllm_torch_requirement": (
            list(sw.vllm_torch_pins)
            if sw.vllm_torch_pins is not None
            else "unknown (package metadata not available)"
            if sw.vllm
            else None
        ),
        "vllm_torch_requirement_met": sw.vllm_torch_ok,
        "packages_source": sw.source or sw.source_reason,
    }


def pip_command(sw: SoftwareFacts) -> str:
    pins = [p for p in sw.vllm_torch_pins or () if p != "(any version)"]
    spec = ",".join(pins)
    cmd = f"pip install --force-reinstall 'torch{spec}'"
    if "+cpu" in spec:
        cmd += " --index-url https://download.pytorch.org/whl/cpu"
    elif sw.torch_cuda is not None and "+" not in spec:
        cmd += f" --index-url https://download.pytorch.org/whl/{cu_tag(sw.torch_cuda)}"
    return cmd


@rule("driver.cuda")
def driver_cuda(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    sw: SoftwareFacts = facts.get("software")
    ev = _software_evidence(sw)
    torch_v = sw.torch.version if sw.torch else None
    if sw.vllm is not None and sw.vllm_torch_ok is False:
        pins = ", ".join(sw.vllm_torch_pins or ())
        have = torch_v or "none"
        yield check.finding(
            Status.FAIL,
            f"{sw.vllm.name} {sw.vllm.version} requires torch {pins}, installed: {have}",
            ev,
            "vllm_pin",
            vllm=f"{sw.vllm.name} {sw.vllm.version}",
            pins=pins,
            torch=have,
            pip_cmd=pip_command(sw),
        )
        return
    stack = f"torch {torch_v or 'not installed'}" if sw.source else sw.source_reason
    if sw.torch_cpu_build:
        stack += " (CPU build)"
    elif sw.torch_cuda:
        stack += f" (CUDA {_ver(sw.torch_cuda)})"
    if sw.vllm:
        stack += f", {sw.vllm.name} {sw.vllm.version}"
    if sw.gpu_state in (State.ERROR, State.DENIED):
        status = Status.FAIL if sw.gpu_state is State.ERROR else Status.WARN
        yield check.finding(status, f"{sw.gpu_reason}; {stack}", ev, "driver_broken")
        return
    if sw.gpu_state is not State.OK:
        yield check.finding(Status.SKIP, f"{sw.gpu_reason or 'no NVIDIA GPU'}; {stack}", ev)
        return
    drv = sw.cuda_driver_version
    driver = sw.driver_version or "unknown"
    summary = f"driver {driver} (CUDA {_ver(drv)}), {stack}"
    if sw.torch is not None and sw.torch_cpu_build:
        base = sw.torch.version.partition("+")[0]
        yield check.finding(
            Status.WARN,
            summary + ": torch cannot use the GPU",
            ev,
            "cpu_torch",
            torch=sw.torch.version,
            torch_base=base,
            cu_tag=cu_tag(drv),
        )
        return
    tc = sw.torch_cuda
    if tc is None or drv is None or sw.torch is None:
        yield check.finding(Status.PASS, summary, ev)
        return
    branch, toolkit = branch_for(tc)
    fmt: dict[str, Any] = {
        "torch": sw.torch.version,
        "torch_cuda": _ver(tc),
        "driver": driver,
        "driver_cuda": _ver(drv),
        "branch": branch,
        "toolkit_driver": toolkit,
        "torch_major": tc[0],
        "driver_major": drv[0],
    }
    if tc[0] > drv[0]:
        base = sw.torch.version.partition("+")[0]
        fmt["torch_cmd"] = (
            f"`pip install --force-reinstall 'torch=={base}' --index-url"
            f" https://download.pytorch.org/whl/{cu_tag(drv)}`"
        )
        yield check.finding(
            Status.FAIL,
            f"{summary}: CUDA {tc[0]} runtime needs a driver >= {MAJOR_MIN_BRANCH.get(tc[0], branch)}"
            f" (R{branch} for CUDA {_ver(tc)}); this driver stops at CUDA {_ver(drv)}",
            ev,
            "driver_major",
            **fmt,
        )
        return
    if tc > drv:
        yield check.finding(
            Status.WARN,
            f"{summary}: CUDA {_ver(tc)} runs on CUDA {_ver(drv)}'s driver through minor-version"
            f" compatibility, but JIT-compiled kernels (Triton) need driver >= {toolkit}",
            ev,
            "driver_minor",
            **fmt,
        )
        return
    yield check.finding(Status.PASS, summary, ev)


# ------------------------------------------------------------------------------------------------
# gpu.processes
# ------------------------------------------------------------------------------------------------
def _mib(n: int | None) -> int | None:
    return n // MIB if n is not None else None


def fitting_utilization(free: int, total: int) -> float:
    """The --gpu-memory-utilization that fits in what is free now, with a 2 % margin, rounded down."""
    return max(0.0, math.floor((free / total - 0.02) * 100) / 100) if total else 0.0


@rule("gpu.processes")
def gpu_processes(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv: GpuInventory = facts.get("gpu")
    if inv.state is not State.OK:
        yield _skip_no_gpu(check, inv)
        return
    for g in inv.gpus:
        procs = [
            {"pid": p.pid, "name": p.name, "used_mib": _mib(p.used_bytes), "kind": p.kind}
            for p in g.processes
        ]
        need = int(g.memory_total * VLLM_DEFAULT_UTILIZATION)
        ev: dict[str, Any] = {
            "processes": procs,
            "memory_total_mib": _mib(g.memory_total),
            "memory_used_mib": _mib(g.memory_used),
            "memory_free_mib": _mib(g.memory_free),
            "vllm_default_utilization": VLLM_DEFAULT_UTILIZATION,
            "vllm_default_needs_mib": _mib(need),
        }
        listed = ", ".join(
            f"{p.pid} {p.name or '?'} {_mib(p.used_bytes) if p.used_bytes is not None else '?'} MiB"
            for p in g.processes
        )
        free_gib = g.memory_free / GIB
        total_gib = g.memory_total / GIB
        if g.memory_total == 0:
            yield check.finding(Status.SKIP, "GPU memory size not reported", ev, subject=_subject(g))
            continue
        if g.memory_free >= need:
            who = f"; other processes: {listed}" if listed else "; no other process holds GPU memory"
            yield check.finding(
                Status.PASS,
                f"{free_gib:.1f} of {total_gib:.1f} GiB free, enough for vLLM's default"
                f" --gpu-memory-utilization {VLLM_DEFAULT_UTILIZATION}{who}",
                ev,
                subject=_subject(g),
            )
            continue
        fit = fitting_utilization(g.memory_free, g.memory_total)
        ev["utilization_that_fits"] = fit
        holders = listed or "none listed (processes in other containers are not visible)"
        status = Status.WARN if fit >= 0.5 else Status.FAIL
        yield check.finding(
            status,
            f"only {free_gib:.1f} of {total_gib:.1f} GiB free"
            f" ({g.memory_used / GIB:.1f} GiB used by: {holders});"
            f" vLLM's default --gpu-memory-utilization {VLLM_DEFAULT_UTILIZATION} needs {need / GIB:.1f} GiB"
            f" free and will refuse to start; {fit:.2f} would fit",
            ev,
            "free",
            _subject(g),
            pids=", ".join(str(p.pid) for p in g.processes) or "see nvidia-smi",
            fit=f"{fit:.2f}",
        )


# ------------------------------------------------------------------------------------------------
# Settings and health
# ------------------------------------------------------------------------------------------------
def _per_gpu(facts: Facts) -> tuple[GpuInventory, list[GpuInfo]]:
    inv: GpuInventory = facts.get("gpu")
    return inv, list(inv.gpus) if inv.state is State.OK else []


@rule("gpu.persistence")
def gpu_persistence(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv, gpus = _per_gpu(facts)
    if not gpus:
        yield _skip_no_gpu(check, inv)
    for g in gpus:
        ev = {"persistence_mode": g.persistence_mode}
        if g.persistence_mode is None:
            yield check.finding(Status.SKIP, "persistence mode not reported", ev, subject=_subject(g))
        elif g.persistence_mode:
            yield check.finding(Status.PASS, "persistence mode on", ev, subject=_subject(g))
        else:
            yield check.finding(
                Status.WARN,
                "persistence mode off: the driver re-initialises the GPU at every start",
                ev,
                "enable",
                _subject(g),
            )


@rule("gpu.ecc")
def gpu_ecc(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv, gpus = _per_gpu(facts)
    if not gpus:
        yield _skip_no_gpu(check, inv)
    for g in gpus:
        ev = {
            "ecc_enabled": g.ecc_enabled,
            "uncorrected_volatile": g.ecc_uncorrected_volatile,
            "remapped_rows_pending": g.remapped_rows_pending,
            "remapped_rows_failed": g.remapped_rows_failed,
        }
        bad: list[str] = []
        if g.ecc_uncorrected_volatile:
            bad.append(f"{g.ecc_uncorrected_volatile} uncorrectable ECC errors since the last reset")
        if g.remapped_rows_pending:
            bad.append("a row remap is pending (takes effect at the next GPU reset)")
        if g.remapped_rows_failed:
            bad.append("a row remap FAILED (no spare rows left)")
        if bad:
            yield check.finding(Status.FAIL, "; ".join(bad), ev, "reset", _subject(g), index=g.index)
        elif g.ecc_enabled is None and g.remapped_rows_pending is None:
            yield check.finding(Status.SKIP, "ECC not supported on this GPU", ev, subject=_subject(g))
        elif g.ecc_enabled is False:
            yield check.finding(
                Status.PASS,
                "ECC off (a few % more memory, no protection against bit flips)",
                ev,
                subject=_subject(g),
            )
        else:
            yield check.finding(
                Status.PASS,
                "ECC on, no uncorrectable errors, no pending/failed row remaps",
                ev,
                subject=_subject(g),
            )


_HW_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


@rule("gpu.throttle")
def gpu_throttle(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv, gpus = _per_gpu(facts)
    if not gpus:
        yield _skip_no_gpu(check, inv)
    for g in gpus:
        ev = {
            "active_reasons": list(g.throttle_reasons),
            "temperature_c": g.temperature_c,
            "power_draw_w": g.power_draw_w,
            "power_limit_w": g.power_limit_w,
            "clock_sm_mhz": g.clock_sm_mhz,
            "clock_sm_max_mhz": g.clock_sm_max_mhz,
        }
        hw = [r for r in g.throttle_reasons if r in _HW_SLOWDOWN]
        temp = f", {g.temperature_c} C" if g.temperature_c is not None else ""
        if hw:
            yield check.finding(
                Status.FAIL,
                f"clocks slowed by {', '.join(hw)}{temp}",
                ev,
                "cooling",
                _subject(g),
                index=g.index,
            )
        elif "sw_power_cap" in g.throttle_reasons:
            limit = f"{g.power_limit_w:.0f}" if g.power_limit_w is not None else "?"
            yield check.finding(
                Status.WARN,
                f"clocks held down by the power cap ({g.power_draw_w} of {limit} W)",
                ev,
                "power",
                _subject(g),
                index=g.index,
                limit=limit,
            )
        else:
            other = ", ".join(g.throttle_reasons) or "none"
            yield check.finding(
                Status.PASS, f"no thermal/power slowdown (active reasons: {other})", ev, subject=_subject(g)
            )


@rule("gpu.mig")
def gpu_mig(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv, gpus = _per_gpu(facts)
    if not gpus:
        yield _skip_no_gpu(check, inv)
    for g in gpus:
        ev = {"mig_enabled": g.mig_enabled, "memory_total_mib": _mib(g.memory_total)}
        if g.mig_enabled is None:
            yield check.finding(Status.SKIP, "MIG not supported on this GPU", ev, subject=_subject(g))
        elif g.mig_enabled:
            yield check.finding(
                Status.WARN,
                "MIG is on: a process sees one instance and its slice of memory, not the whole"
                f" {g.memory_total / GIB:.0f} GiB",
                ev,
                "disable",
                _subject(g),
                index=g.index,
            )
        else:
            yield check.finding(Status.PASS, "MIG off: the whole card is available", ev, subject=_subject(g))


# (minimum compute capability, what it enables); sources: vLLM's quantization docs ("supported hardware")
# and the kernels' own capability checks (Marlin: sm_80+; FP8 W8A8/KV on FP8 units: sm_89+).
CAPABILITIES: tuple[tuple[tuple[int, int], str], ...] = (
    ((7, 0), "fp16"),
    ((8, 0), "bf16"),
    ((8, 0), "Marlin GPTQ/AWQ int4 kernels"),
    ((8, 9), "FP8 weights and activations (W8A8), FP8 KV cache on FP8 units"),
)


@rule("gpu.compute_capability")
def gpu_compute_capability(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    inv, gpus = _per_gpu(facts)
    if not gpus:
        yield _skip_no_gpu(check, inv)
    for g in gpus:
        cc = g.compute_capability
        if cc is None:
            yield check.finding(
                Status.SKIP, f"compute capability of {g.name} unknown", {}, subject=_subject(g)
            )
            continue
        can = [what for need, what in CAPABILITIES if cc >= need]
        cannot = [what for need, what in CAPABILITIES if cc < need]
        ev = {
            "compute_capability": f"{cc[0]}.{cc[1]}",
            "source": g.compute_capability_source,
            "architecture": g.architecture,
            "can_run": can,
            "cannot_run": cannot,
        }
        sm = f"sm_{cc[0]}{cc[1]}"
        arch = f" ({g.architecture})" if g.architecture else ""
        if cc >= (8, 0):
            tail = f"; not: {', '.join(cannot)}" if cannot else ""
            yield check.finding(Status.PASS, f"{sm}{arch}: {', '.join(can)}{tail}", ev, subject=_subject(g))
        else:
            yield check.finding(
                Status.WARN,
                f"{sm}{arch}: no bf16 and no Marlin kernels; {', '.join(cannot)} unavailable",
                ev,
                "older",
                _subject(g),
            )

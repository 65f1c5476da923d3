"""Rule for ``cpu.governor`` (definition in checks/cpu.toml; facts from tuner/probes/cpu.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.host import State
from tuner.probes import Facts
from tuner.probes.cpu import CpuFacts


def evidence(cf: CpuFacts) -> dict[str, Any]:
    ev: dict[str, Any] = {
        "model": cf.model,
        "vendor": cf.vendor,
        "logical_cpus": cf.logical_cpus,
        "online": cf.online,
        "isa": list(cf.isa),
        "avx512": "avx512f" in cf.flags,
        "amx": "amx_tile" in cf.flags,
        "governors": cf.governors(),
        "drivers": list(cf.drivers()),
    }
    if cf.pstate:
        ev["pstate"] = dict(cf.pstate)
    if cf.cpuinfo_reason:
        ev["cpuinfo"] = cf.cpuinfo_reason
    if cf.freq_reason:
        ev["cpufreq"] = cf.freq_reason
    return ev


@rule("cpu.governor")
def cpu_governor(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    cf: CpuFacts = facts.get("cpu")
    ev = evidence(cf)
    if cf.freq_state is State.ERROR:
        yield check.finding(Status.ERROR, f"cpufreq could not be read: {cf.freq_reason}", ev)
        return
    if cf.freq_state is not State.OK:
        yield check.finding(Status.SKIP, cf.freq_reason or "no cpufreq", ev)
        return
    govs = cf.governors()
    slow = {g: cpus for g, cpus in govs.items() if g != "performance"}
    drivers = ", ".join(cf.drivers()) or "unknown driver"
    if not slow:
        yield check.finding(Status.PASS, f"performance governor on all CPUs ({drivers})", ev)
        return
    parts = "; ".join(f"{g} on CPUs {cpus}" for g, cpus in slow.items())
    note = ""
    if "powersave" in slow and any(v == "active" for v in cf.pstate.values()):
        note = " (the pstate driver's powersave still scales with load, but ramps up slower than performance)"
    yield check.finding(Status.WARN, f"{parts} ({drivers}){note}", ev, "performance")

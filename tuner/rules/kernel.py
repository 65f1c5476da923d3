"""Rule for ``kernel.xid`` (definition in checks/kernel.toml; facts from tuner/probes/kernel.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.gpu import GpuInventory
from tuner.host import State
from tuner.probes import Facts
from tuner.probes.kernel import KernelFacts

_SHOWN = 20  # the last Xid lines kept in the evidence


@rule("kernel.xid")
def kernel_xid(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    kf: KernelFacts = facts.get("kernel")
    inv: GpuInventory = facts.get("gpu")
    if kf.state is not State.OK:
        yield check.finding(Status.SKIP, kf.reason, {"source": kf.source or None})
        return
    ev: dict[str, Any] = {"source": kf.source, "lines_read": kf.lines_read}
    if not kf.xids:
        if inv.state is not State.OK:
            summary = (
                f"{inv.reason or 'no NVIDIA GPU'}; no NVRM Xid lines in {kf.lines_read} kernel log lines"
            )
            yield check.finding(Status.SKIP, summary, ev)
        else:
            yield check.finding(
                Status.PASS, f"no Xid errors in the last {kf.lines_read} kernel log lines", ev
            )
        return
    counts = Counter(x.code for x in kf.xids)
    ev["xids"] = [
        {"code": code, "count": n, "meaning": next(x.meaning for x in kf.xids if x.code == code)}
        for code, n in sorted(counts.items())
    ]
    ev["lines"] = [x.line for x in kf.xids[-_SHOWN:]]
    hardware = sorted({x.code for x in kf.xids if x.severity == "fail"})
    gpus = ", ".join(sorted({x.pci or "?" for x in kf.xids}))
    listed = "; ".join(
        f"Xid {c} x{n}: {ev['xids'][i]['meaning']}" for i, (c, n) in enumerate(sorted(counts.items()))
    )
    if hardware:
        codes = ", ".join(map(str, hardware))
        yield check.finding(Status.FAIL, listed, ev, "hardware", codes=codes, gpus=gpus)
    else:
        codes = ", ".join(map(str, sorted(counts)))
        yield check.finding(Status.WARN, listed, ev, "software", codes=codes)

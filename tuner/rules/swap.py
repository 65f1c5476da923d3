"""Rule for ``swap.device`` (definition in checks/swap.toml; facts from tuner/probes/swap.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.probes import Facts
from tuner.probes.memory import fmt_bytes
from tuner.probes.swap import Media, SwapArea, SwapFacts

LOW_HEADROOM = 0.10  # less than this share of RAM available, with no swap to fall back on

_WORDS = {
    Media.NVME: "an NVMe drive",
    Media.SSD: "a SATA/SAS SSD",
    Media.ROTATIONAL: "a rotational disk",
    Media.ZRAM: "zram (compressed RAM)",
    Media.VIRTIO: "a virtual (virtio) disk",
    Media.UNKNOWN: "a device of unknown type",
}


def _area_evidence(a: SwapArea) -> dict[str, Any]:
    return {
        "filename": a.entry.filename,
        "type": a.entry.type,
        "size": a.entry.size,
        "size_human": fmt_bytes(a.entry.size),
        "used": a.entry.used,
        "priority": a.entry.priority,
        "device": a.device,
        "media": a.media.value,
        "disks": [
            {
                "name": d.name,
                "media": d.media.value,
                "rotational": d.rotational,
                "transport": d.transport,
                "model": d.model,
                "sysfs": d.sysfs_path,
            }
            for d in a.disks
        ],
        "trace": list(a.trace),
        **({"reason": a.reason} if a.reason else {}),
    }


@rule("swap.device")
def swap_device(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    sf: SwapFacts = facts.get("swap")
    ram: dict[str, Any] = {
        "mem_total": sf.mem_total,
        "mem_available": sf.mem_available,
        "mem_total_human": fmt_bytes(sf.mem_total),
        "mem_available_human": fmt_bytes(sf.mem_available),
        "headroom": (
            f"{fmt_bytes(sf.mem_available)} of {fmt_bytes(sf.mem_total)} available"
            if sf.mem_available is not None
            else f"{fmt_bytes(sf.mem_total)} in all (MemAvailable not reported)"
        ),
    }
    if sf.state_reason:
        yield check.finding(Status.SKIP, f"swap areas unknown: {sf.state_reason}", {**ram, "swaps": []})
        return
    if not sf.areas:
        ev: dict[str, Any] = {**ram, "swaps": []}
        low = (
            sf.mem_total is not None
            and sf.mem_available is not None
            and sf.mem_available < sf.mem_total * LOW_HEADROOM
        )
        if low:
            yield check.finding(
                Status.WARN,
                f"no swap and RAM is short ({ram['headroom']}): the OOM killer is close",
                ev,
                "low_headroom",
            )
        else:
            yield check.finding(Status.PASS, f"no swap; RAM: {ram['headroom']}", ev)
        return
    for a in sf.areas:
        ev = {**ram, **_area_evidence(a)}
        what = _WORDS[a.media]
        subject = a.entry.filename
        where = f"{subject} ({a.entry.type}, {fmt_bytes(a.entry.size)}) is on {what}"
        if a.device and a.device not in subject:
            where += f" via {a.device}"
        fmt = {"device": a.device or subject, "media": a.media.value, "filename": subject}
        if a.media in (Media.ROTATIONAL, Media.SSD):
            worst = " (the slowest kind)" if a.media is Media.ROTATIONAL else ""
            yield check.finding(
                Status.FAIL,
                f"{where}{worst}: swapping during model load or KV offload stalls the server",
                ev,
                "move_swap",
                subject=subject,
                **fmt,
            )
        elif a.media is Media.VIRTIO:
            yield check.finding(
                Status.WARN,
                f"{where}: its real medium is unknown",
                ev,
                "check_virtual",
                subject=subject,
                **fmt,
            )
        elif a.media is Media.UNKNOWN:
            why = f": {a.reason}" if a.reason else ""
            yield check.finding(Status.WARN, f"{where}{why}", ev, "classify", subject=subject, **fmt)
        elif a.media is Media.ZRAM:
            yield check.finding(
                Status.PASS,
                f"{where}: fast, but it takes RAM from vLLM while it holds pages",
                ev,
                subject=subject,
            )
        else:
            yield check.finding(Status.PASS, where, ev, subject=subject)

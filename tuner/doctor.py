"""`gputune doctor`: probe a host root, run the checks, render the findings, choose the exit code.

The host is the live machine (``/``) or a snapshot (``--from`` a folder or a tarball). Probes run
lazily, only for the checks selected (``--only``/``--skip``), and heavy modules are imported only
when a renderer needs them: the JSON path never imports rich, and nothing here imports torch.

Exit codes: 0 unless a finding's status reaches ``--fail-on`` (``fail`` by default; ``warn``
makes warnings count; ``error`` makes broken probes count too) -> 1; usage errors -> 2.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tuner.errors import ExitCode, UsageError
from tuner.findings import Finding, Status
from tuner.host import NVIDIA_SMI_XML, SNAPSHOT_META, Host

SCHEMA_VERSION = 1
FAIL_ON_RANK = {"fail": Status.FAIL.rank, "warn": Status.WARN.rank, "error": Status.ERROR.rank}


@dataclass(frozen=True)
class Report:
    """One doctor run: what was diagnosed and what was found. Every renderer displays this."""

    host: dict[str, Any]  # source, live, hostname, kernel, os, ...
    findings: tuple[Finding, ...]
    fail_on: str  # fail | warn | error
    exit_code: int
    elapsed_s: float = 0.0
    selected: tuple[str, ...] = field(default_factory=tuple)  # the check ids that ran

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for f in self.findings:
            counts[f.status.value] += 1
        return counts

    def worst(self) -> Status | None:
        ranked = [f.status for f in self.findings if f.status not in (Status.PASS, Status.SKIP)]
        return max(ranked, key=lambda s: s.rank) if ranked else None


def exit_code_for(findings: list[Finding] | tuple[Finding, ...], fail_on: str) -> int:
    """1 when a finding's status reaches the ``--fail-on`` threshold, else 0."""
    threshold = FAIL_ON_RANK[fail_on]
    bad = any(f.status.rank >= threshold and f.status.rank > 0 for f in findings)
    return int(ExitCode.BAD_ANSWER if bad else ExitCode.OK)


def _os_release(text: str) -> str | None:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"')
    return values.get("PRETTY_NAME") or values.get("NAME")


def host_info(host: Host, source: Path | None) -> dict[str, Any]:
    """Who is being diagnosed: cheap reads only (no probe runs for this)."""
    from tuner import __version__

    info: dict[str, Any] = {
        "source": "live" if source is None else str(source),
        "live": host.live,
        "hostname": None,
        "kernel": None,
        "os": None,
        "gputune_version": __version__,
    }
    hn = host.read_value("/proc/sys/kernel/hostname")
    if hn.ok and hn.value:
        info["hostname"] = hn.value
    kr = host.read_value("/proc/sys/kernel/osrelease")
    if kr.ok and kr.value:
        info["kernel"] = kr.value
    osr = host.read_text("/etc/os-release", limit=64 << 10)
    if osr.ok and osr.value:
        info["os"] = _os_release(osr.value)
    if host.live:
        import os

        uname = os.uname()
        info["hostname"] = info["hostname"] or uname.nodename
        info["kernel"] = info["kernel"] or uname.release
    else:
        meta = host.extra(SNAPSHOT_META)
        if meta.is_file():
            import json

            try:
                data = json.loads(meta.read_text(errors="replace"))
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict):
                info["snapshot"] = data
                for key in ("hostname", "kernel"):
                    if not info[key] and isinstance(data.get(key), str):
                        info[key] = data[key]
    return info


# What a snapshot root holds at least one of (README, "Snapshot layout").
_SNAPSHOT_MARKERS = ("proc", "sys", "etc/os-release", NVIDIA_SMI_XML)


def diagnose(
    host: Host,
    *,
    source: Path | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    fail_on: str = "fail",
    under_load: bool = False,
    **options: Any,
) -> Report:
    """Run the selected checks against a host root and build the report (no rendering)."""
    from tuner.checks import load_defs, run_checks, select
    from tuner.probes import Facts

    start = time.perf_counter()
    defs = select(load_defs(), list(only or []), list(skip or []))
    facts = Facts(host, under_load=under_load, **options)
    findings = tuple(run_checks(facts, defs))
    return Report(
        host=host_info(host, source),
        findings=findings,
        fail_on=fail_on,
        exit_code=exit_code_for(findings, fail_on),
        elapsed_s=time.perf_counter() - start,
        selected=tuple(d.id for d in defs),
    )


def render(report: Report, fmt: str, verbose: bool, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if fmt == "json":
        from tuner.render.json import render_doctor as render_json

        render_json(report, out)
        return
    from tuner.render.table import render_doctor as render_table

    render_table(report, out, verbose=verbose)


def main(
    source: Path | None,
    fmt: str,
    only: list[str],
    skip: list[str],
    fail_on: str,
    under_load: bool,
    verbose: bool,
) -> int:
    """`gputune doctor`; returns the exit code. Usage errors are raised as UsageError (exit 2)."""
    host = Host.live_host() if source is None else Host.at(source)
    if source is not None and not any(host.path(p).exists() for p in _SNAPSHOT_MARKERS):
        host.close()
        # A mistyped path would otherwise give a clean report of skips.
        raise UsageError(
            f"{source}: not a host snapshot (none of {', '.join(_SNAPSHOT_MARKERS)} in it)",
            "make one with `gputune snapshot -o FILE.tar.gz`, or lay the host's files out at their own paths",
        )
    with host:
        report = diagnose(host, source=source, only=only, skip=skip, fail_on=fail_on, under_load=under_load)
        render(report, fmt, verbose)
    return report.exit_code

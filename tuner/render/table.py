"""The doctor's human form: a rich table on a terminal, plain aligned text in a pipe.

Both show, per finding: status, check id, subject, summary and the remediation (its command,
and whether it needs root, a reboot or the BIOS). Evidence is shown for findings that are not
passing, and for all of them with ``--verbose``. rich is imported only for a terminal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TextIO

from tuner.findings import Finding, Remediation, Status

if TYPE_CHECKING:
    from tuner.doctor import Report

_STYLE = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.SKIP: "dim",
    Status.ERROR: "magenta",
}
_MAX_VALUE = 160


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    text = str(v.value if hasattr(v, "value") and not isinstance(v, (int, float, str)) else v)
    return text if len(text) <= _MAX_VALUE else text[: _MAX_VALUE - 3] + "..."


def _readable(d: dict[str, Any]) -> list[tuple[str, Any]]:
    """Items to show: a byte count with a readable twin ("size" and "size_human") appears once, readable."""
    out: list[tuple[str, Any]] = []
    for key, value in d.items():
        if value is None or value == [] or value == {} or f"{key}_human" in d:
            continue
        out.append((key.removesuffix("_human"), value))
    return out


def evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """Flatten a finding's evidence into short "key: value" lines (None values left out)."""
    lines: list[str] = []
    for key, value in _readable(evidence):
        if isinstance(value, dict):
            inner = ", ".join(f"{k}={_scalar(v)}" for k, v in _readable(value))
            lines.append(f"{key}: {inner}")
        elif isinstance(value, (list, tuple)):
            if all(isinstance(v, dict) for v in value):
                lines.append(f"{key}:")
                for item in value:
                    lines.append("  - " + ", ".join(f"{k}={_scalar(v)}" for k, v in _readable(item)))
            else:
                lines.append(f"{key}: {', '.join(_scalar(v) for v in value)}")
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return lines


def _needs(rem: Remediation) -> str:
    needs = [
        w
        for w, on in (("root", rem.needs_root), ("reboot", rem.needs_reboot), ("BIOS", rem.needs_bios))
        if on
    ]
    if rem.persistent is False:
        needs.append("not persistent")
    return f" [{', '.join(needs)}]" if needs else ""


def _show_evidence(f: Finding, verbose: bool) -> bool:
    return verbose or f.status in (Status.WARN, Status.FAIL, Status.ERROR)


def _summary_line(report: Report) -> str:
    c = report.counts()
    order = ("fail", "warn", "error", "pass", "skip")
    parts = ", ".join(f"{c[k]} {k}" for k in order)
    where = report.host.get("hostname") or report.host.get("source")
    n = len(report.findings)
    return f"{n} findings on {where}: {parts} (exit {report.exit_code}, --fail-on {report.fail_on})"


def render_plain(report: Report, out: TextIO, verbose: bool = False) -> None:
    """Aligned text for pipes and logs: one block per finding."""
    width = max((len(f.id) for f in report.findings), default=8)
    for f in report.findings:
        subject = f" [{f.subject}]" if f.subject else ""
        out.write(f"{f.status.value.upper():<5}  {f.id:<{width}}  {f.summary}{subject}\n")
        pad = " " * (7 + width + 2)
        if f.remediation and f.status is not Status.PASS:
            out.write(f"{pad}fix: {f.remediation.summary}{_needs(f.remediation)}\n")
            if f.remediation.command:
                out.write(f"{pad}run: {f.remediation.command}\n")
        if _show_evidence(f, verbose):
            for line in evidence_lines(f.evidence):
                out.write(f"{pad}| {line}\n")
    out.write(_summary_line(report) + "\n")


def render_rich(report: Report, out: TextIO, verbose: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(file=out)
    table = Table(show_lines=False, header_style="bold", expand=False, pad_edge=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("subject", overflow="fold")
    table.add_column("summary", ratio=3, overflow="fold")
    table.add_column("remediation", ratio=2, overflow="fold")
    for f in report.findings:
        summary = Text(f.summary)
        if _show_evidence(f, verbose):
            lines = evidence_lines(f.evidence)
            if lines:
                summary.append("\n" + "\n".join(lines), style="dim")
        fix = Text()
        if f.remediation and f.status is not Status.PASS:
            fix.append(f.remediation.summary + _needs(f.remediation))
            if f.remediation.command:
                fix.append("\n$ " + f.remediation.command, style="bold cyan")
        table.add_row(Text(f.status.value, style=_STYLE[f.status]), f.id, f.subject or "", summary, fix)
    console.print(table)
    console.print(_summary_line(report), style="bold" if report.exit_code else None, highlight=False)


def render_doctor(report: Report, out: TextIO, verbose: bool = False) -> None:
    """A rich table on a terminal, plain text otherwise."""
    is_tty = getattr(out, "isatty", None)
    if is_tty is not None and is_tty():
        render_rich(report, out, verbose)
    else:
        render_plain(report, out, verbose)

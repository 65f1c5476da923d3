"""Terminal rendering of a triage diagnosis (rich; plain text when stdout is a pipe)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tuner.triage import Diagnosis


def _flags(changes: dict[str, str | None]) -> str:
    parts = []
    for flag, value in changes.items():
        if value is None:
            parts.append(f"remove {flag}")
        elif value == "":
            parts.append(flag)
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def render_table(diag: Diagnosis) -> None:
    from rich.console import Console
    from rich.markup import escape

    con = Console(highlight=False, soft_wrap=True)
    colour = "green" if diag.cause != "unknown" else "yellow"
    con.print(f"[bold {colour}]{escape(diag.cause)}[/] — {escape(diag.title)}")
    con.print(
        f"confidence {diag.confidence:.2f} · stage {diag.stage}"
        + (f" · vLLM {diag.vllm_version}" if diag.vllm_version else "")
        + ("" if diag.fixable_by_args else " · not fixable by vLLM arguments")
    )
    if diag.evidence:
        con.print("\n[bold]Evidence[/]")
        for ev in diag.evidence:
            where = f"line {ev.line}" if ev.line else ev.kind
            con.print(f"  [{ev.kind}] {where}: {escape(ev.text)}")
            if ev.detail:
                con.print(f"      [dim]{escape(ev.detail)}[/]")
    rem = diag.remediation
    con.print("\n[bold]Remediation[/]")
    con.print(f"  {escape(rem.summary)}")
    if rem.flag_changes:
        con.print(f"  next arguments: [bold]{escape(_flags(rem.flag_changes))}[/]")
    if rem.env_changes:
        env = " ".join(f"{k}={v}" for k, v in rem.env_changes.items())
        con.print(f"  environment: [bold]{escape(env)}[/]")
    for i, alt in enumerate(rem.alternatives, start=1):
        extra = _flags(alt.flag_changes)
        if alt.env_changes:
            extra = (extra + " " + " ".join(f"{k}={v}" for k, v in alt.env_changes.items())).strip()
        con.print(f"  {i}. {escape(alt.summary)}" + (f"  ({escape(extra)})" if extra else ""))
    if diag.alternatives:
        con.print("\n[bold]Other possible causes[/]")
        for cause, conf in diag.alternatives:
            con.print(f"  {cause} ({conf:.2f})")

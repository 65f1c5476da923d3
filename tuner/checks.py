"""Checks: definitions as data (``checks/*.toml``), rules as pure functions over facts.

A check definition (kube-bench style) names the check, says what it looks at
and carries the remediation texts; a rule (``tuner/rules/<area>.py``, registered
with :func:`rule`) reads :class:`~tuner.probes.Facts` and returns findings. A
rule that raises becomes one ``error`` finding; the other checks still run.

TOML layout, one file per area (``checks/pcie.toml`` -> rules in ``tuner.rules.pcie``)::

    [[check]]
    id = "pcie.link"
    title = "PCIe link generation and width"
    description = "..."
    [check.remediation.degraded_width]
    summary = "Reseat the card in a x16 slot ..."
    needs_bios = true
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tuner.data import load_toml, toml_files
from tuner.errors import UsageError
from tuner.findings import Finding, Remediation, Status
from tuner.probes import Facts


@dataclass(frozen=True)
class CheckDef:
    id: str
    title: str
    area: str  # file stem: checks/<area>.toml, rules in tuner.rules.<area>
    description: str = ""
    remediations: dict[str, dict[str, Any]] = field(default_factory=dict)

    def remediation(self, key: str, **fmt: Any) -> Remediation:
        """Build the remediation ``key`` of this check, formatting ``{placeholders}`` with ``fmt``."""
        raw = self.remediations[key]
        text = {k: (v.format(**fmt) if isinstance(v, str) else v) for k, v in raw.items()}
        persistent = raw.get("persistent")  # a TOML boolean, or absent
        return Remediation(
            summary=text["summary"],
            command=text.get("command"),
            needs_root=bool(text.get("needs_root", False)),
            needs_reboot=bool(text.get("needs_reboot", False)),
            needs_bios=bool(text.get("needs_bios", False)),
            persistent=persistent if isinstance(persistent, bool) else None,
            doc=text.get("doc"),
        )

    def finding(
        self,
        status: Status,
        summary: str,
        evidence: dict[str, Any] | None = None,
        remediation: str | Remediation | None = None,
        subject: str | None = None,
        **fmt: Any,
    ) -> Finding:
        rem = self.remediation(remediation, **fmt) if isinstance(remediation, str) else remediation
        return Finding(self.id, status, summary, evidence or {}, rem, subject, self.title)


Rule = Callable[[Facts, CheckDef], Iterable[Finding]]
_RULES: dict[str, Rule] = {}


def rule(check_id: str) -> Callable[[Rule], Rule]:
    """Register the rule that evaluates check ``check_id``."""

    def register(fn: Rule) -> Rule:
        _RULES[check_id] = fn
        return fn

    return register


def load_defs() -> list[CheckDef]:
    """Every shipped check definition, in file then declaration order."""
    defs: list[CheckDef] = []
    for path in toml_files("checks"):
        data = load_toml(path)
        for raw in data.get("check", []):
            defs.append(
                CheckDef(
                    id=raw["id"],
                    title=raw.get("title", raw["id"]),
                    area=path.stem,
                    description=raw.get("description", ""),
                    remediations=dict(raw.get("remediation", {})),
                )
            )
    return defs


def select(defs: list[CheckDef], only: list[str], skip: list[str]) -> list[CheckDef]:
    """Apply --only/--skip; an id (or an area prefix like ``gpu``) that matches nothing is a usage error."""
    known = {d.id for d in defs}

    def matches(d: CheckDef, name: str) -> bool:
        return d.id == name or d.id.startswith(name + ".")

    for name in [*only, *skip]:
        if not any(matches(d, name) for d in defs):
            raise UsageError(f"unknown check {name!r}", "known checks: " + ", ".join(sorted(known)))
    chosen = [d for d in defs if not only or any(matches(d, n) for n in only)]
    return [d for d in chosen if not any(matches(d, n) for n in skip)]


def rule_for(d: CheckDef) -> Rule | None:
    if d.id not in _RULES:
        importlib.import_module(f"tuner.rules.{d.area}")
    return _RULES.get(d.id)


def run_checks(facts: Facts, defs: list[CheckDef]) -> list[Finding]:
    findings: list[Finding] = []
    for d in defs:
        try:
            fn = rule_for(d)
            if fn is None:
                raise LookupError(f"no rule is registered for check {d.id!r}")
            got = list(fn(facts, d))
        except Exception as exc:  # a broken probe or rule is a finding, never a crash
            got = [
                Finding(
                    d.id,
                    Status.ERROR,
                    f"the check broke: {type(exc).__name__}: {exc}",
                    {"exception": type(exc).__name__, "message": str(exc)},
                    None,
                    None,
                    d.title,
                )
            ]
        findings.extend(got)
    return findings

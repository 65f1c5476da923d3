"""The one result model of the doctor: findings with a closed set of states.

A check turns facts into :class:`Finding` values; renderers (table, JSON, ...)
only display them. The JSON form is an interface (see README, "doctor JSON").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() of members
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # not applicable here, with the reason (a VM without cpufreq)
    ERROR = "error"  # the probe broke; the other checks still ran

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Status.PASS: 0, Status.SKIP: 0, Status.ERROR: 1, Status.WARN: 2, Status.FAIL: 3}


@dataclass(frozen=True)
class Remediation:
    """What to do about a finding."""

    summary: str
    command: str | None = None  # a command to run, when one exists
    needs_root: bool = False
    needs_reboot: bool = False
    needs_bios: bool = False  # a firmware/BIOS setting or a physical change
    persistent: bool | None = None  # does the change survive a reboot (None: n/a)
    doc: str | None = None  # where to read more

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "command": self.command,
            "needs_root": self.needs_root,
            "needs_reboot": self.needs_reboot,
            "needs_bios": self.needs_bios,
            "persistent": self.persistent,
            "doc": self.doc,
        }


@dataclass(frozen=True)
class Finding:
    id: str  # stable check id, e.g. "pcie.link"; users grep and alert on it
    status: Status
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    remediation: Remediation | None = None
    subject: str | None = None  # what the finding is about when a check runs per item ("gpu0")
    title: str = ""  # the check's human name

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status.value,
            "summary": self.summary,
            "evidence": self.evidence,
            "remediation": self.remediation.to_dict() if self.remediation else None,
            "subject": self.subject,
            "title": self.title,
        }

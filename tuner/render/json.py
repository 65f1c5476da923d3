"""The doctor's JSON form: one object, documented in the README ("doctor JSON"), versioned.

    {
      "schema_version": 1,
      "host": {"source": "live", "live": true, "hostname": ..., "kernel": ..., "os": ..., ...},
      "checks": [Finding.to_dict(), ...],   # id, status, summary, evidence, remediation, subject, title
      "summary": {"pass": 5, "warn": 1, "fail": 0, "skip": 4, "error": 0, "total": 10,
                  "worst": "warn", "fail_on": "fail", "exit_code": 0}
    }

Never imports rich: `gputune doctor --format json` stays fast.
"""

from __future__ import annotations

import enum
import json
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from tuner.doctor import Report


def _default(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    if isinstance(obj, PurePath):
        return str(obj)
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    return str(obj)


def doctor_object(report: Report) -> dict[str, Any]:
    from tuner.doctor import SCHEMA_VERSION

    counts = report.counts()
    worst = report.worst()
    return {
        "schema_version": SCHEMA_VERSION,
        "host": report.host,
        "checks": [f.to_dict() for f in report.findings],
        "summary": {
            **counts,
            "total": len(report.findings),
            "worst": worst.value if worst else "pass",
            "fail_on": report.fail_on,
            "exit_code": report.exit_code,
            "elapsed_s": round(report.elapsed_s, 4),
        },
    }


def render_doctor(report: Report, out: TextIO) -> None:
    json.dump(doctor_object(report), out, indent=2, default=_default)
    out.write("\n")

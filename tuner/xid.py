"""The Xid catalogue: NVIDIA's ``NVRM: Xid`` codes, as the doctor's ``kernel.xid`` and triage read them.

One table, ``[xid.N]`` in checks/kernel.toml: ``meaning`` (what the driver reports), ``severity`` (fail:
hardware or the link; warn: usually the application), and for triage the ``cause`` label and ``weight``
a code alone lends it. Source: NVIDIA "XID Errors" (docs.nvidia.com/deploy/xid-errors).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tuner.data import data_dir, load_toml

UNLISTED_MEANING = "Xid not in gputune's catalogue: see NVIDIA's Xid list"


@dataclass(frozen=True)
class XidCode:
    code: int
    meaning: str
    severity: str  # "fail" | "warn"
    cause: str  # a triage label
    weight: float


@functools.cache
def catalogue() -> dict[int, XidCode]:
    doc = load_toml(data_dir("checks") / "kernel.toml").get("xid", {})
    out: dict[int, XidCode] = {}
    for key, raw in doc.items():
        code = int(key)
        severity = str(raw["severity"])
        if severity not in ("fail", "warn"):
            raise ValueError(f"checks/kernel.toml [xid.{code}]: severity {severity!r} is not fail or warn")
        out[code] = XidCode(code, str(raw["meaning"]), severity, str(raw["cause"]), float(raw["weight"]))
    return out


def meaning(code: int) -> tuple[str, str]:
    """(meaning, severity) of a code; an unlisted code is a warning with a pointer to NVIDIA's list."""
    entry = catalogue().get(code)
    return (entry.meaning, entry.severity) if entry else (UNLISTED_MEANING, "warn")

"""Kernel log probe: NVIDIA Xid events (``NVRM: Xid``) and OOM-killer kills.

Sources: on the live host ``dmesg`` (may be denied to non-root when
``kernel.dmesg_restrict=1``), else ``journalctl -k``; on a snapshot its
``dmesg.txt``. Only the tail is read (:data:`TAIL_LINES`).

Xid meanings: the catalogue in checks/kernel.toml [xid] (tuner/xid.py), shared with triage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tuner import xid
from tuner.host import DMESG, Host, Reading, State
from tuner.probes import Facts

TAIL_LINES = 20000

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\):\s*(\d+)(?:,\s*(.*))?")
_PID = re.compile(r"\bpid='?(\d+)'?")
_OOM = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)")


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci: str | None  # "0000:3b:00" as the driver prints it
    meaning: str
    severity: str  # "fail" | "warn"
    line: str  # the whole log line, for the evidence
    pid: int | None = None


@dataclass(frozen=True)
class OomKill:
    pid: int
    name: str
    line: str


@dataclass(frozen=True)
class KernelFacts:
    state: State  # OK: a log was read; ABSENT/DENIED: none could be read (reason says why)
    reason: str
    source: str  # "dmesg" | "journalctl -k" | "dmesg.txt"
    lines_read: int
    xids: tuple[XidEvent, ...] = ()
    oom_kills: tuple[OomKill, ...] = ()


def parse_kernel_log(text: str) -> tuple[tuple[XidEvent, ...], tuple[OomKill, ...], int]:
    """Pure parser of a kernel log (dmesg, journalctl -k): Xid events, OOM kills, and the line count."""
    xids: list[XidEvent] = []
    ooms: list[OomKill] = []
    lines = text.splitlines()[-TAIL_LINES:]
    for line in lines:
        if "NVRM: Xid" in line:
            m = _XID.search(line)
            if m:
                code = int(m.group(2))
                meaning, severity = xid.meaning(code)
                pid = _PID.search(m.group(3) or "")
                xids.append(
                    XidEvent(
                        code,
                        m.group(1),
                        meaning,
                        severity,
                        line.strip()[:500],
                        int(pid.group(1)) if pid else None,
                    )
                )
        elif "Out of memory: Killed process" in line:
            m = _OOM.search(line)
            if m:
                ooms.append(OomKill(int(m.group(1)), m.group(2), line.strip()[:500]))
    return tuple(xids), tuple(ooms), len(lines)


def read_kernel_log(host: Host) -> tuple[Reading[str], str]:
    """The kernel log text and where it came from (the snapshot reuses this to write dmesg.txt)."""
    if not host.live:
        path = host.extra(DMESG)
        try:
            data = path.read_bytes()[-(16 << 20) :]
        except FileNotFoundError:
            return Reading.missing(State.ABSENT, f"no {DMESG} in snapshot: kernel log not captured"), DMESG
        except OSError as exc:
            return Reading.missing(State.ERROR, f"{DMESG}: {exc.strerror or exc}"), DMESG
        return Reading.of(data.decode("utf-8", errors="replace")), DMESG
    reasons: list[str] = []
    journal = ["journalctl", "-k", "-b", "--no-pager", "-q", "-o", "short", "-n", str(TAIL_LINES)]
    for argv, label in ((["dmesg"], "dmesg"), (journal, "journalctl -k")):
        res = host.run(argv, 5.0)
        if res.returncode == 0:
            return Reading.of(res.stdout), label
        first = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[0]
        reasons.append(f"{label}: {first}")
    denied = any(w in r.lower() for r in reasons for w in ("not permitted", "permission"))
    state = State.DENIED if denied else State.ABSENT
    hint = " (run as root, or `sudo sysctl kernel.dmesg_restrict=0`)"
    return Reading.missing(state, "; ".join(reasons) + hint), ""


def probe(facts: Facts) -> KernelFacts:
    text, source = read_kernel_log(facts.host)
    if not text.ok or text.value is None:
        return KernelFacts(text.state, text.reason, source, 0)
    xids, ooms, count = parse_kernel_log(text.value)
    return KernelFacts(State.OK, "", source, count, xids, ooms)

"""The run directory: every record of one `gputune launch`, written so that no crash loses it.

This layout is an interface: `gputune triage` reads it, and users attach it to
bug reports. Default location ``runs/<UTC YYYYmmdd-HHMMSS>-<model name>/``
under the current directory (``--run-dir`` chooses another).

Files at the top level (attempt 1, and the run as a whole):

``command.json``
    ``{"argv": [...], "cwd": str, "env": {added or changed variables},
    "numa": {"node": int | null, "bound": bool, "reason": str},
    "attempt": int, "started_at": ISO-8601 UTC}``. Secrets (the API key) are
    ``***`` here and in every other file.
``plan.json``
    The plan (``Plan.to_dict()`` of :mod:`tuner.plan`) the command was built from.
``doctor.json``
    ``{"findings": [Finding.to_dict(), ...], "blocking": [ids], "forced": bool}``
    (or ``{"error": str}`` when the doctor could not run).
``vllm.log``
    vLLM's full stdout and stderr, written by vLLM itself into this file as it
    streams (unbuffered), so it survives a crash of vLLM *and* of gputune.
``telemetry.csv``
    ``time,gpu,mem_used_mib,mem_total_mib,util_gpu,util_mem,power_w,temp_c,
    sm_clock_mhz,throttle,pcie_tx_kbs,pcie_rx_kbs``; ``time`` is Unix seconds,
    ``throttle`` the active clock-event reasons joined by ``|`` (empty: none),
    an empty cell means "not reported". One row per GPU per sample (NVML, or
    ``nvidia-smi dmon`` parsed). No rows on a host without NVIDIA GPUs.
``gpu-processes.csv``
    ``time,gpu,pid,name,used_mib``: compute processes per GPU (NVML), at most 1 Hz.
``metrics.csv``
    ``time,kv_cache_usage,running,waiting,preemptions`` scraped from vLLM's
    ``/metrics`` once it serves (``kv_cache_usage`` is a fraction 0..1).
``events.jsonl``
    One JSON object per line: ``{"time": unix s, "mono": monotonic s, "kind": str,
    "message": str, "data": {...}}``. Kinds include ``start``, ``doctor``,
    ``exec`` (vLLM's process started), ``startup_complete_seen``, ``ready``,
    ``smoke``, ``warning``, ``exit``, ``diagnosis``, ``relaunch``, ``stop``,
    ``interrupted``. It records every attempt.
``smoke.json``
    ``{"requests": [{"ttft_s", "tokens", "seconds", "tokens_per_s"}], "ttft_s_median",
    "tokens_per_s_median", "ok": bool}`` from a few streaming completions.
``exit.json``
    ``{"returncode": int | null, "signal": "SIGKILL" | null, "ended_at": ISO-8601,
    "reason": str, "stage": "startup" | "serving" | "stopped" | "interrupted",
    "attempt": int}``.
``dmesg.txt``
    The kernel log tail captured after a failure, when readable.

``attempt-2/``, ``attempt-3/``, ...: each ``--auto-fix`` relaunch gets
``command.json``, ``plan.json``, ``vllm.log``, ``telemetry.csv``,
``gpu-processes.csv``, ``exit.json`` (and ``dmesg.txt``) of its own.

How nothing is lost: streams (CSV, events, the log) are opened in append mode
and flushed after every line; JSON documents are written to a temporary file
in the same folder and renamed over the target, so a reader sees the old or
the new document, never half of one.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REDACTED = "***"

TELEMETRY_COLUMNS = (
    "time",
    "gpu",
    "mem_used_mib",
    "mem_total_mib",
    "util_gpu",
    "util_mem",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "throttle",
    "pcie_tx_kbs",
    "pcie_rx_kbs",
)
PROCESS_COLUMNS = ("time", "gpu", "pid", "name", "used_mib")
METRICS_COLUMNS = ("time", "kv_cache_usage", "running", "waiting", "preemptions")

COMMAND = "command.json"
PLAN = "plan.json"
DOCTOR = "doctor.json"
VLLM_LOG = "vllm.log"
TELEMETRY = "telemetry.csv"
GPU_PROCESSES = "gpu-processes.csv"
METRICS = "metrics.csv"
EVENTS = "events.jsonl"
SMOKE = "smoke.json"
EXIT = "exit.json"
DMESG = "dmesg.txt"


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def default_run_dir(model_name: str, cwd: Path | None = None, now: datetime | None = None) -> Path:
    """``runs/<UTC YYYYmmdd-HHMMSS>-<model name>`` under ``cwd``; the name made safe for a path."""
    when = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name.strip("/").rsplit("/", 1)[-1]) or "model"
    return (cwd or Path.cwd()) / "runs" / f"{when}-{safe}"


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """A copy of ``value`` (JSON-like) with every occurrence of each secret replaced by ``***``."""
    keys = [s for s in secrets if s]
    if not keys:
        return value
    if isinstance(value, str):
        for s in keys:
            value = value.replace(s, REDACTED)
        return value
    if isinstance(value, Mapping):
        return {k: redact(v, keys) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, keys) for v in value]
    return value


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and rename it over ``path``: a crash leaves
    the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` atomically (see :func:`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


class CsvStream:
    """An append-only CSV file: header once, one flushed line per row, safe across threads."""

    def __init__(self, path: Path, columns: Sequence[str]) -> None:
        self.path = path
        self.columns = tuple(columns)
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not path.exists() or path.stat().st_size == 0
        self._fh = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - closed in close()
        if fresh:
            self._write_line(self.columns)

    def _write_line(self, cells: Sequence[Any]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(["" if c is None else _cell(c) for c in cells])
        self._fh.write(buf.getvalue())
        self._fh.flush()

    def write(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            if not self._fh.closed:
                self._write_line([row.get(c) for c in self.columns])

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # NaN: not reported
            return ""
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return str(v)


class EventLog:
    """``events.jsonl``: one JSON object per line, flushed at once; secrets redacted."""

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if s]
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def emit(self, kind: str, message: str, **data: Any) -> dict[str, Any]:
        record = {
            "time": round(time.time(), 6),
            "mono": round(time.monotonic(), 6),
            "kind": kind,
            "message": message,
            "data": data,
        }
        record = dict(redact(record, self.secrets))
        line = json.dumps(record, default=str) + "\n"
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line)
                self._fh.flush()
        return record

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of a run, skipping a torn last line (a crash mid-write)."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


class RunDir:
    """One run's folder. ``attempt(n)`` is the folder of attempt n (1 = the top level)."""

    def __init__(self, path: Path, secrets: Iterable[str] = ()) -> None:
        self.path = path
        self.secrets = [s for s in secrets if s]
        path.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(path / EVENTS, self.secrets)

    def attempt(self, n: int) -> Path:
        p = self.path if n <= 1 else self.path / f"attempt-{n}"
        p.mkdir(parents=True, exist_ok=True)
        return p

    def write_json(self, name: str, obj: Any, attempt: int = 1) -> Path:
        path = self.attempt(attempt) / name
        write_json_atomic(path, redact(obj, self.secrets))
        return path

    def event(self, kind: str, message: str, **data: Any) -> dict[str, Any]:
        return self.events.emit(kind, message, **data)

    def close(self) -> None:
        self.events.close()

"""Side inputs of triage: telemetry, GPU process list, exit status, command line, run directory layout.

Telemetry comes in three shapes, told apart by their first lines:

- the recorder's CSV written by `gputune launch` (header ``time,gpu,mem_used_mib,mem_total_mib,...``),
- raw ``nvidia-smi dmon -s pucvmet -o DT`` output: ``#`` lines name the columns (``fb`` = MB used,
  ``sm``/``mem`` = utilisation %), ``-`` means not available,
- NVML samples as the capture sampler writes them (no header: unix time, used MiB, total MiB,
  GPU util %, memory util %; ``nvmlDeviceGetMemoryInfo`` and ``nvmlDeviceGetUtilizationRates``).

Only a bounded summary is kept (running maxima, the last samples), so a day of samples is cheap.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_LOG_NAMES = ("vllm.log", "server.log", "output.log", "stdout.log")


@dataclass(frozen=True)
class TelemetrySummary:
    """Facts from a telemetry file (memory in MiB)."""

    format: str
    samples: int
    peak_used_mib: float | None
    total_mib: float | None
    last_used_mib: float | None
    util_peak: float | None
    util_last: float | None
    plateau_samples: int  # consecutive samples at the peak (within 1%) before the end or the drop
    dropped_after_peak: bool  # memory fell back by more than half after its peak (the process died)
    gpus: int | None = None  # distinct GPUs in the samples (recorder ``gpu`` column, dmon ``gpu``/Idx)

    def at_capacity(self, total_mib: float | None = None) -> bool:
        total = self.total_mib or total_mib
        if self.peak_used_mib is None or not total:
            return False
        return self.peak_used_mib >= 0.95 * total


@dataclass(frozen=True)
class GpuProcessSample:
    pid: int
    name: str
    used_mib: float


@dataclass
class RunFiles:
    """The files of one run directory (the last attempt), as `gputune launch` lays them out."""

    log: Path | None = None
    telemetry: Path | None = None
    gpu_processes: Path | None = None
    dmesg: Path | None = None
    exit_json: Path | None = None
    command_json: Path | None = None
    plan_json: Path | None = None
    attempt: str | None = None
    others: list[Path] = field(default_factory=list)


def locate_run(path: Path) -> RunFiles:
    """Pick the last attempt (attempt-N/ with the largest N, else the directory itself)."""
    if path.is_file():
        return RunFiles(log=path)
    base = path
    attempts = []
    for child in path.iterdir():
        if child.is_dir() and child.name.startswith("attempt-"):
            try:
                attempts.append((int(child.name.split("-", 1)[1]), child))
            except ValueError:
                continue
    files = RunFiles()
    if attempts:
        attempts.sort()
        base = attempts[-1][1]
        files.attempt = base.name

    def first(*names: str) -> Path | None:
        # each attempt has its own files (tuner/rundir.py); never mix another attempt's records in
        for n in names:
            if (base / n).is_file():
                return base / n
        return None

    files.log = first(*RUN_LOG_NAMES)
    if files.log is None:
        logs = sorted(base.glob("*.log"), key=lambda p: p.stat().st_size, reverse=True)
        files.log = logs[0] if logs else None
    files.telemetry = first("telemetry.csv")
    files.gpu_processes = first("gpu-processes.csv")
    files.dmesg = first("dmesg.txt")
    files.exit_json = first("exit.json")
    files.command_json = first("command.json")
    files.plan_json = first("plan.json")
    return files


def _num(value: str) -> float | None:
    value = value.strip()
    if not value or value in {"-", "N/A", "[N/A]", "nan"}:
        return None
    try:
        return float(value)
    except ValueError:
        return None


class _Summariser:
    def __init__(self) -> None:
        self.samples = 0
        self.peak: float | None = None
        self.total: float | None = None
        self.last: float | None = None
        self.util_peak: float | None = None
        self.util_last: float | None = None
        self.recent: deque[float] = deque(maxlen=4096)
        self.gpu_ids: set[str] = set()

    def add(self, used: float | None, total: float | None, util: float | None) -> None:
        self.samples += 1
        if total:
            self.total = max(self.total or 0.0, total)
        if used is not None:
            self.last = used
            self.peak = used if self.peak is None else max(self.peak, used)
            self.recent.append(used)
        if util is not None:
            self.util_last = util
            self.util_peak = util if self.util_peak is None else max(self.util_peak, util)

    def result(self, fmt: str) -> TelemetrySummary:
        plateau = 0
        dropped = False
        if self.peak:
            values = list(self.recent)
            last_peak = max(i for i, v in enumerate(values) if v >= self.peak * 0.99) if values else -1
            i = last_peak
            while i >= 0 and values[i] >= self.peak * 0.99:
                plateau += 1
                i -= 1
            dropped = bool(values) and values[-1] < 0.5 * self.peak
        return TelemetrySummary(
            format=fmt,
            samples=self.samples,
            peak_used_mib=self.peak,
            total_mib=self.total,
            last_used_mib=self.last,
            util_peak=self.util_peak,
            util_last=self.util_last,
            plateau_samples=plateau,
            dropped_after_peak=dropped,
            gpus=len(self.gpu_ids) if self.gpu_ids else None,
        )


def read_telemetry(path: Path) -> TelemetrySummary:
    """Summarise a telemetry file in any of the three formats (see the module docstring)."""
    summ = _Summariser()
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        first = ""
        for line in fh:
            if line.strip():
                first = line
                break
        if first.startswith("#"):
            return _read_dmon(first, fh, summ)
        if "mem_used_mib" in first or "time" in first.split(",")[0]:
            return _read_recorder(first, fh, summ)
        _nvml_line(first, summ)
        for line in fh:
            _nvml_line(line, summ)
        return summ.result("nvml-csv")


def _nvml_line(line: str, summ: _Summariser) -> None:
    parts = line.strip().split(",")
    if len(parts) < 3:
        return
    used, total = _num(parts[1]), _num(parts[2])
    util = _num(parts[3]) if len(parts) > 3 else None
    if used is None and total is None:
        return
    summ.add(used, total, util)


def _read_recorder(header: str, fh: io.TextIOBase | Any, summ: _Summariser) -> TelemetrySummary:
    cols = [c.strip() for c in next(csv.reader([header]))]
    idx = {c: i for i, c in enumerate(cols)}
    for row in csv.reader(fh):
        if not row:
            continue

        def get(name: str, r: list[str] = row) -> float | None:
            i = idx.get(name)
            return _num(r[i]) if i is not None and i < len(r) else None

        gi = idx.get("gpu")
        if gi is not None and gi < len(row) and row[gi].strip() and len(summ.gpu_ids) < 64:
            summ.gpu_ids.add(row[gi].strip())
        summ.add(get("mem_used_mib"), get("mem_total_mib"), get("util_gpu"))
    return summ.result("recorder-csv")


def _read_dmon(first: str, fh: Any, summ: _Summariser) -> TelemetrySummary:
    """`nvidia-smi dmon` text, through the project's one dmon parser (tuner.telemetry.DmonParser)."""
    from tuner.telemetry import DmonParser

    parser = DmonParser()
    for line in itertools.chain([first], fh):
        sample = parser.feed(line)
        if sample is None:
            continue
        if sample.gpu is not None and len(summ.gpu_ids) < 64:
            summ.gpu_ids.add(str(sample.gpu))
        used, util = sample.values.get("fb"), sample.values.get("sm")
        if used is None and util is None:
            continue
        summ.add(used, None, util)
    return summ.result("nvidia-smi-dmon")


def read_gpu_processes(path: Path) -> list[tuple[str, GpuProcessSample]]:
    """Rows of gpu-processes.csv (time,gpu,pid,name,used_mib) as (time, sample); at most 10000 kept."""
    out: list[tuple[str, GpuProcessSample]] = []
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            try:
                pid = int(row.get("pid") or 0)
                used = float(row.get("used_mib") or 0)
            except ValueError:
                continue
            out.append((str(row.get("time", "")), GpuProcessSample(pid, str(row.get("name", "")), used)))
            if len(out) >= 10000:
                break
    return out


def read_json(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {"argv": value} if isinstance(value, list) else {}


def exit_from_json(doc: dict[str, Any]) -> int | None:
    """The exit status from exit.json: a negative number for a signal (like Python's returncode)."""
    rc = doc.get("returncode")
    sig = doc.get("signal")
    if isinstance(sig, str):
        name = sig.upper().removeprefix("SIG")
        if name == "KILL":
            return -9
        if name.isdigit() and int(name) > 0:
            return -int(name)
    if isinstance(sig, int) and sig > 0:
        return -sig
    if isinstance(rc, int):
        return rc
    return None


def killed_by_sigkill(code: int | None) -> bool:
    return code in (-9, 137)

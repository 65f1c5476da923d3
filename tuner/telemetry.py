"""Telemetry of a serving run on one timeline: NVML samples, `nvidia-smi dmon`, vLLM's ``/metrics``.

Sources, each written to the run directory (see :mod:`tuner.rundir` for the columns):

- NVML through the one adapter, :class:`tuner.gpu.NvmlSampler` -> ``telemetry.csv`` and
  ``gpu-processes.csv`` (1 Hz by default; PCIe throughput and processes at 1 Hz at most, since NVML
  measures PCIe over a 20 ms window per call);
- the text of ``nvidia-smi dmon -s pucvmet -o DT`` (:func:`parse_dmon`), for hosts where only the
  tool is at hand or for logs users attach; the same ``telemetry.csv`` columns (:func:`dmon_row`);
- vLLM's Prometheus ``/metrics`` (:func:`parse_metrics`) -> ``metrics.csv``: KV cache usage
  (``vllm:kv_cache_usage_perc``, ``vllm:gpu_cache_usage_perc`` before v0.10), running and waiting
  requests, preemptions (``vllm:num_preemptions_total``); names from vllm/v1/metrics/loggers.py.

While a run serves, :class:`Watch` turns the samples into warnings in the event log: GPU memory near
capacity and still rising, clock throttling for power/thermal/hardware reasons, KV cache nearly
full with preemptions, and new NVRM Xid lines in the kernel log.

``python -m tuner.telemetry record --out DIR --interval 0.1 --duration 40`` runs the recorder alone
(bench/gpu/telemetry.sh uses it beside `nvidia-smi dmon`).
"""

from __future__ import annotations

import argparse
import calendar
import contextlib
import math
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.rundir import (
    GPU_PROCESSES,
    METRICS,
    METRICS_COLUMNS,
    PROCESS_COLUMNS,
    TELEMETRY,
    TELEMETRY_COLUMNS,
    CsvStream,
    EventLog,
)

# ----------------------------------------------------------------------------------------------
# nvidia-smi dmon text
# ----------------------------------------------------------------------------------------------
_NA = {"-", "n/a", "na", "[n/a]", "[na]", "none", ""}


@dataclass(frozen=True)
class DmonSample:
    """One data line of `nvidia-smi dmon`: column name (from the header) -> value."""

    gpu: int | None  # the "gpu" column (index); None when the column is absent or "-"
    time: float | None  # Unix seconds from the Date/Time columns (-o DT), local time of the host
    values: Mapping[str, float | None]  # numeric columns; "-" / N/A -> None
    raw: Mapping[str, str] = field(default_factory=dict)  # every column as printed


class DmonParser:
    """Streaming parser: feed lines, get samples. Robust to what dmon and its readers do.

    - the header is the ``#`` line naming the columns (``#Date Time gpu pwr ... fb ...``); the next
      ``#`` line holds units and is kept aside; headers repeat and may change (another ``-s``);
    - ``--format csv`` output (commas) is read as well as the aligned default;
    - ``-`` or ``N/A`` means not reported; a line whose cell count differs from the header
      (a partial last line, garbage) is skipped and counted in ``skipped``.
    """

    def __init__(self, columns: Iterable[str] | None = None, utc: bool = False) -> None:
        self.columns: list[str] = [c.lower() for c in columns] if columns else []
        self.utc = utc  # Date/Time columns are UTC (dmon run with TZ=UTC), not this host's local time
        self.units: list[str] = []
        self.skipped = 0

    @staticmethod
    def _split(line: str) -> list[str]:
        if "," in line:
            return [c.strip() for c in line.split(",")]
        return line.split()

    def feed(self, line: str) -> DmonSample | None:
        line = line.rstrip("\r\n")
        if not line.strip():
            return None
        if line.lstrip().startswith("#"):
            cells = self._split(line.lstrip()[1:])
            names = [c.lower() for c in cells]
            if "gpu" in names or ("date" in names and "time" in names):
                self.columns = names
                self.units = []
            elif self.columns and len(cells) == len(self.columns):
                self.units = cells
            return None
        cells = self._split(line)
        if not self.columns or len(cells) != len(self.columns):
            self.skipped += 1
            return None
        raw = dict(zip(self.columns, cells, strict=True))
        values: dict[str, float | None] = {}
        for name, cell in raw.items():
            if name in ("date", "time"):
                continue
            values[name] = _number(cell)
        gpu_val = values.get("gpu")
        gpu = int(gpu_val) if gpu_val is not None and gpu_val == int(gpu_val) else None
        if "gpu" in raw and gpu is None and raw["gpu"].lower() not in _NA:
            self.skipped += 1  # a gpu cell that is not a number: not a dmon line
            return None
        when = _dmon_time(raw.get("date"), raw.get("time"), self.utc)
        return DmonSample(gpu=gpu, time=when, values=values, raw=raw)


def _number(cell: str) -> float | None:
    if cell.strip().lower() in _NA:
        return None
    try:
        v = float(cell)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _dmon_time(date: str | None, clock: str | None, utc: bool = False) -> float | None:
    if not clock:
        return None
    try:
        if date:
            st = time.strptime(f"{date} {clock}", "%Y%m%d %H:%M:%S")
        else:
            today = time.strftime("%Y%m%d")
            st = time.strptime(f"{today} {clock}", "%Y%m%d %H:%M:%S")
    except ValueError:
        return None
    try:
        return float(calendar.timegm(st)) if utc else time.mktime(st)
    except (OverflowError, ValueError):
        return None


def parse_dmon(text: str | Iterable[str], utc: bool = False) -> list[DmonSample]:
    """Every sample in a `nvidia-smi dmon` output (text, or lines with their line ends).

    dmon ends every line with a newline, so a last line without one was cut (dmon killed, a file
    copied while written) and is dropped: a number cut short would look whole. Garbage is skipped.
    """
    parser = DmonParser(utc=utc)
    lines = text.splitlines(keepends=True) if isinstance(text, str) else list(text)
    terminated = isinstance(text, str) or any(line.endswith("\n") for line in lines[:-1])
    if lines and terminated and not lines[-1].endswith("\n"):
        lines.pop()
        parser.skipped += 1
    out = []
    for line in lines:
        s = parser.feed(line)
        if s is not None:
            out.append(s)
    return out


def dmon_row(
    sample: DmonSample, arrival: float | None = None, mem_total_mib: float | None = None
) -> dict[str, Any]:
    """A ``telemetry.csv`` row from a dmon sample (``fb`` MB -> mem_used_mib, ``sm`` -> util_gpu, ...).

    dmon reports power/thermal violations (``pviol`` % of time, ``tviol`` bool) rather than NVML's
    reason bits: they become ``power`` / ``thermal`` in the throttle column. PCIe MB/s -> KB/s.
    """
    v = sample.values
    reasons = []
    if (v.get("pviol") or 0) > 0:
        reasons.append("power")
    if (v.get("tviol") or 0) > 0:
        reasons.append("thermal")

    def kbs(name: str) -> int | None:
        x = v.get(name)
        return int(x * 1024) if x is not None else None

    t = sample.time if sample.time is not None else arrival
    return {
        "time": t,
        "gpu": sample.gpu,
        "mem_used_mib": v.get("fb"),
        "mem_total_mib": mem_total_mib,
        "util_gpu": _as_int(v.get("sm")),
        "util_mem": _as_int(v.get("mem")),
        "power_w": v.get("pwr"),
        "temp_c": _as_int(v.get("gtemp", v.get("temp"))),
        "sm_clock_mhz": _as_int(v.get("pclk")),
        "throttle": "|".join(reasons),
        "pcie_tx_kbs": kbs("txpci"),
        "pcie_rx_kbs": kbs("rxpci"),
    }


def _as_int(x: float | None) -> int | None:
    return int(x) if x is not None else None


# ----------------------------------------------------------------------------------------------
# vLLM /metrics (Prometheus text exposition format 0.0.4)
# ----------------------------------------------------------------------------------------------
_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(
    text: str, only: tuple[str, ...] | None = None
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: ``{name: [(labels, value), ...]}``; comments and bad lines skipped.

    ``only``: keep the metrics whose names start with one of these (cheap: vLLM exposes ~600 lines).
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or (only is not None and not line.startswith(only)):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m.group("labels") or ""))
        out.setdefault(m.group("name"), []).append((labels, value))
    return out


@dataclass(frozen=True)
class VllmMetrics:
    """What the recorder keeps of vLLM's /metrics (summed or averaged over engines)."""

    kv_cache_usage: float | None  # vllm:kv_cache_usage_perc (0..1; "perc" is a fraction), mean
    running: int | None  # vllm:num_requests_running, sum
    waiting: int | None  # vllm:num_requests_waiting, sum
    preemptions: int | None  # vllm:num_preemptions_total (counter), sum


KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc")
PREEMPTION_NAMES = ("vllm:num_preemptions_total", "vllm:num_preemptions")


_WANTED = (*KV_USAGE_NAMES, *PREEMPTION_NAMES, "vllm:num_requests_running", "vllm:num_requests_waiting")


def parse_metrics(text: str) -> VllmMetrics:
    samples = parse_prometheus(text, only=_WANTED)

    def pick(names: Iterable[str]) -> list[float] | None:
        for n in names:
            vals = [v for _, v in samples.get(n, []) if math.isfinite(v)]
            if vals:
                return vals
        return None

    kv = pick(KV_USAGE_NAMES)
    running = pick(["vllm:num_requests_running"])
    waiting = pick(["vllm:num_requests_waiting"])
    pre = pick(PREEMPTION_NAMES)
    return VllmMetrics(
        kv_cache_usage=sum(kv) / len(kv) if kv else None,
        running=int(sum(running)) if running else None,
        waiting=int(sum(waiting)) if waiting else None,
        preemptions=int(sum(pre)) if pre else None,
    )


def scrape_metrics(url: str, timeout: float = 2.0) -> VllmMetrics | None:
    """GET ``url`` (vLLM's /metrics) and parse it; None when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read(8 << 20).decode("utf-8", errors="replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return parse_metrics(body)


# ----------------------------------------------------------------------------------------------
# Warnings while a run serves
# ----------------------------------------------------------------------------------------------
# Clock-event reasons that are not a problem: an idle GPU, clocks set by the admin, sync boost.
BENIGN_THROTTLE = frozenset(
    {"gpu_idle", "applications_clocks_setting", "sync_boost", "display_clocks_setting"}
)
XID = re.compile(r"NVRM: Xid \((?P<dev>[^)]*)\): (?P<code>\d+)")


@dataclass(frozen=True)
class Warning_:
    kind: str  # memory_near_capacity | throttling | kv_cache_full | preemptions | xid
    message: str
    data: dict[str, Any]


class Watch:
    """Turns samples into warnings, each once per episode (no flood while a condition lasts)."""

    def __init__(self, near: float = 0.95, clear: float = 0.90, window_s: float = 5.0) -> None:
        self.near = near
        self.clear = clear
        self.window_s = window_s
        self._mem: dict[int, deque[tuple[float, float]]] = {}
        self._mem_warned: set[int] = set()
        self._throttle: dict[int, frozenset[str]] = {}
        self._kv_warned = False
        self._preemptions: int | None = None
        self._xid_seen: set[str] = set()

    def gpu(
        self, t: float, gpu: int, used: float | None, total: float | None, throttle: Iterable[str]
    ) -> list[Warning_]:
        out: list[Warning_] = []
        if used is not None and total:
            hist = self._mem.setdefault(gpu, deque())
            hist.append((t, used))
            while hist and t - hist[0][0] > self.window_s:
                hist.popleft()
            frac = used / total
            rising = len(hist) >= 2 and used > min(u for _, u in hist)
            if frac >= self.near and rising and gpu not in self._mem_warned:
                self._mem_warned.add(gpu)
                out.append(
                    Warning_(
                        "memory_near_capacity",
                        f"GPU {gpu}: memory {used:.0f}/{total:.0f} MiB ({frac:.0%}) and still rising",
                        {"gpu": gpu, "used_mib": used, "total_mib": total, "fraction": round(frac, 4)},
                    )
                )
            elif frac < self.clear:
                self._mem_warned.discard(gpu)
        bad = frozenset(r for r in throttle if r not in BENIGN_THROTTLE)
        if bad and bad != self._throttle.get(gpu, frozenset()):
            out.append(
                Warning_(
                    "throttling",
                    f"GPU {gpu}: clocks throttled ({', '.join(sorted(bad))})",
                    {"gpu": gpu, "reasons": sorted(bad)},
                )
            )
        self._throttle[gpu] = bad
        return out

    def metrics(self, m: VllmMetrics) -> list[Warning_]:
        out: list[Warning_] = []
        if m.kv_cache_usage is not None:
            if m.kv_cache_usage >= self.near and not self._kv_warned:
                self._kv_warned = True
                out.append(
                    Warning_(
                        "kv_cache_full",
                        f"KV cache {m.kv_cache_usage:.0%} used; new requests will wait or preempt others",
                        {"kv_cache_usage": m.kv_cache_usage, "waiting": m.waiting},
                    )
                )
            elif m.kv_cache_usage < self.clear:
                self._kv_warned = False
        if m.preemptions is not None:
            if self._preemptions is not None and m.preemptions > self._preemptions:
                out.append(
                    Warning_(
                        "preemptions",
                        f"vLLM preempted {m.preemptions - self._preemptions} request(s) (KV cache full)",
                        {"preemptions": m.preemptions},
                    )
                )
            self._preemptions = m.preemptions
        return out

    def kernel_log(self, lines: Iterable[str], baseline: bool = False) -> list[Warning_]:
        """NVRM Xid lines not seen before (``baseline``: remember, do not warn)."""
        out: list[Warning_] = []
        for line in lines:
            m = XID.search(line)
            if not m or line in self._xid_seen:
                continue
            self._xid_seen.add(line)
            if not baseline:
                out.append(
                    Warning_(
                        "xid",
                        f"kernel: NVRM Xid {m.group('code')} on {m.group('dev')}: {line.strip()[:200]}",
                        {"code": int(m.group("code")), "device": m.group("dev"), "line": line.strip()},
                    )
                )
        return out


# ----------------------------------------------------------------------------------------------
# The recorder
# ----------------------------------------------------------------------------------------------
class GpuSampler(Protocol):
    """What the recorder needs of :class:`tuner.gpu.NvmlSampler` (a stand-in in tests)."""

    reason: str

    def open(self) -> bool: ...

    def sample(self, now: float, monotonic: float) -> list[Any]: ...


KernelLogReader = Callable[[], list[str] | None]


class Recorder:
    """Background threads writing telemetry into a folder, and warnings into an event log.

    ``sampler``: NVML (default :class:`tuner.gpu.NvmlSampler`); ``metrics_url``: vLLM's /metrics,
    settable later (:meth:`watch_metrics`) once the server serves; ``kernel_log``: a function that
    returns the kernel log's lines (polled every ``kernel_log_every`` s for new Xid lines).
    """

    def __init__(
        self,
        out_dir: Path,
        events: EventLog | None = None,
        interval: float = 1.0,
        sampler: GpuSampler | None = None,
        kernel_log: KernelLogReader | None = None,
        kernel_log_every: float = 5.0,
        metrics_interval: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.out_dir = out_dir
        self.events = events
        self.interval = max(0.01, interval)
        self.metrics_interval = max(0.2, metrics_interval if metrics_interval is not None else interval)
        self.sampler = sampler
        self.kernel_log = kernel_log
        self.kernel_log_every = kernel_log_every
        self.clock = clock
        self.watch = Watch()
        self.samples = 0
        self.gpu_count = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_url: str | None = None
        self._metrics_ready = threading.Event()
        self._telemetry: CsvStream | None = None
        self._processes: CsvStream | None = None
        self._metrics: CsvStream | None = None
        self.last_processes: dict[int, tuple[Any, ...]] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._telemetry = CsvStream(self.out_dir / TELEMETRY, TELEMETRY_COLUMNS)
        self._processes = CsvStream(self.out_dir / GPU_PROCESSES, PROCESS_COLUMNS)
        if self.sampler is None:
            from tuner.gpu import NvmlSampler

            self.sampler = NvmlSampler()
        self._spawn(self._gpu_loop, "gputune-nvml")
        self._spawn(self._metrics_loop, "gputune-metrics")

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=self._guard(fn), name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as exc:  # a recorder bug must never take the launch down
                self._event("telemetry_error", f"{fn.__name__} stopped: {type(exc).__name__}: {exc}")

        return run

    def watch_metrics(self, url: str) -> None:
        """Start scraping vLLM's /metrics at ``url``."""
        self._metrics_url = url
        if self._metrics is None:
            self._metrics = CsvStream(self.out_dir / METRICS, METRICS_COLUMNS)
        self._metrics_ready.set()

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        self._metrics_ready.set()
        for t in self._threads:
            t.join(timeout)
        for s in (self._telemetry, self._processes, self._metrics):
            if s is not None:
                s.close()

    def _event(self, kind: str, message: str, **data: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, message, **data)

    def _warn(self, warnings: Iterable[Warning_]) -> None:
        for w in warnings:
            self._event("warning", w.message, warning=w.kind, **w.data)
            print(f"gputune: warning: {w.message}", file=sys.stderr, flush=True)

    # -- loops ------------------------------------------------------------------------------
    def _ticks(self, interval: float) -> Iterator[float]:
        """Monotonic deadlines on a fixed grid (no drift); skips ticks when a sample ran late."""
        nxt = time.monotonic()
        while not self._stop.is_set():
            yield nxt
            nxt += interval
            now = time.monotonic()
            if nxt < now:
                nxt = now + interval - ((now - nxt) % interval)
            if self._stop.wait(max(0.0, nxt - now)):
                return

    def _gpu_loop(self) -> None:
        assert self.sampler is not None
        if not self.sampler.open():
            self._event("telemetry", f"no GPU telemetry: {self.sampler.reason}", source="nvml")
            return
        next_kernel = time.monotonic()
        if self.kernel_log is not None:
            self.watch.kernel_log(self.kernel_log() or [], baseline=True)
            next_kernel += self.kernel_log_every
        first = True
        for tick in self._ticks(self.interval):
            now = self.clock()
            rows = self.sampler.sample(now, tick)
            if first:
                self.gpu_count = len(rows)
                self._event("telemetry", f"NVML sampling {len(rows)} GPU(s) every {self.interval:g} s")
                first = False
            self.samples += 1
            for s in rows:
                self._write_sample(s)
            if self.kernel_log is not None and tick >= next_kernel:
                next_kernel = tick + self.kernel_log_every
                self._warn(self.watch.kernel_log(self.kernel_log() or []))

    def _write_sample(self, s: Any) -> None:
        assert self._telemetry is not None and self._processes is not None
        throttle = tuple(s.throttle or ())
        self._telemetry.write(
            {
                "time": round(s.time, 3),
                "gpu": s.index,
                "mem_used_mib": s.mem_used_mib,
                "mem_total_mib": s.mem_total_mib,
                "util_gpu": s.util_gpu,
                "util_mem": s.util_mem,
                "power_w": s.power_w,
                "temp_c": s.temp_c,
                "sm_clock_mhz": s.sm_clock_mhz,
                "throttle": "|".join(throttle),
                "pcie_tx_kbs": s.pcie_tx_kbs,
                "pcie_rx_kbs": s.pcie_rx_kbs,
            }
        )
        if s.processes is not None:
            self.last_processes[s.index] = tuple(s.processes)
            for p in s.processes:
                used = p.used_bytes / 1048576.0 if p.used_bytes is not None else None
                self._processes.write(
                    {"time": round(s.time, 3), "gpu": s.index, "pid": p.pid, "name": p.name, "used_mib": used}
                )
        self._warn(self.watch.gpu(s.time, s.index, s.mem_used_mib, s.mem_total_mib, throttle))

    def _metrics_loop(self) -> None:
        self._metrics_ready.wait()
        if self._stop.is_set() or self._metrics_url is None:
            return
        for _ in self._ticks(self.metrics_interval):
            m = scrape_metrics(self._metrics_url, timeout=min(2.0, self.metrics_interval * 2))
            if m is None or self._metrics is None:
                continue
            self._metrics.write(
                {
                    "time": round(self.clock(), 3),
                    "kv_cache_usage": m.kv_cache_usage,
                    "running": m.running,
                    "waiting": m.waiting,
                    "preemptions": m.preemptions,
                }
            )
            self._warn(self.watch.metrics(m))


def dmesg_reader(host: Any = None) -> KernelLogReader:
    """Read the kernel log through the host's command runner (``dmesg``); None when not readable."""

    def read() -> list[str] | None:
        from tuner.host import Host

        h = host or Host.live_host()
        res = h.run(["dmesg", "--notime"], 5.0)
        if res.returncode != 0:
            return None
        return res.stdout.splitlines()

    return read


# ----------------------------------------------------------------------------------------------
# python -m tuner.telemetry record ...
# ----------------------------------------------------------------------------------------------
def record(out: Path, interval: float, duration: float) -> int:
    """Run the NVML recorder alone for ``duration`` seconds (or until SIGINT/SIGTERM) into ``out``;
    prints a JSON summary (samples, CPU seconds and % of one core over the wall time)."""
    import json
    import resource

    out.mkdir(parents=True, exist_ok=True)
    events = EventLog(out / "events.jsonl")
    from tuner.gpu import NvmlSampler

    sampler = NvmlSampler()
    sampler.open()  # NVML's import and init are not part of the steady cost measured below
    rec = Recorder(out, events=events, interval=interval, sampler=sampler, kernel_log=dmesg_reader())
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # stop early, and cleanly, on Ctrl-C or kill
        signal.signal(sig, lambda *_: done.set())
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    rec.start()
    with contextlib.suppress(KeyboardInterrupt):
        done.wait(duration)
    rec.stop()
    wall = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # dmesg polls for Xid lines
    cpu_children = kids.ru_utime + kids.ru_stime
    summary = {
        "out": str(out),
        "interval_s": interval,
        "wall_s": round(wall, 3),
        "samples": rec.samples,
        "gpus": rec.gpu_count,
        "cpu_s": round(cpu, 4),
        "cpu_percent_of_one_core": round(100.0 * cpu / wall, 3) if wall > 0 else None,
        "cpu_s_children": round(cpu_children, 4),
        "nvml": getattr(rec.sampler, "reason", "") or "ok",
    }
    events.emit("summary", "recorder finished", **summary)
    events.close()
    print(json.dumps(summary))
    return 0 if rec.samples else 1


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tuner.telemetry", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record NVML telemetry into a folder for a while")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--interval", type=float, default=1.0)
    r.add_argument("--duration", type=float, default=10.0)
    p = sub.add_parser("dmon", help="convert `nvidia-smi dmon` text to telemetry.csv rows on stdout")
    p.add_argument("file", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        return record(args.out, args.interval, args.duration)
    import csv

    try:
        text = args.file.read_text(errors="replace")
    except OSError as exc:
        print(f"gputune: error: {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    w = csv.DictWriter(sys.stdout, fieldnames=TELEMETRY_COLUMNS, lineterminator="\n")
    w.writeheader()
    for s in parse_dmon(text):
        w.writerow(dmon_row(s))
    return 0


if __name__ == "__main__":
    sys.exit(_main())

"""CPU cost of the telemetry recorder at 10 Hz, against `nvidia-smi dmon` and an idle baseline.

On a machine with an NVIDIA GPU this runs the recorder on the real NVML and `nvidia-smi dmon -d 1`
side by side. Without one (CI, laptops) the recorder runs on a stand-in NVML that answers every call
at once: that measures gputune's own loop (scheduling, CSV lines, warnings), not the driver's
ioctls, and the GPU numbers come from bench/gpu/telemetry.sh (read from its capture when present at
tests/fixtures/gpu/telemetry/). Also: dmon parsing and /metrics parsing throughput.

Usage: .venv/bin/python bench/telemetry.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.gpu import NvmlSampler  # noqa: E402
from tuner.rundir import EventLog  # noqa: E402
from tuner.telemetry import Recorder, parse_dmon, parse_metrics  # noqa: E402

GPU_CAPTURE = REPO / "tests" / "fixtures" / "gpu" / "telemetry"


def cpu_now() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def stand_in_nvml() -> types.ModuleType:
    """Constant answers in the shapes pynvml returns (values of the H200 at idle)."""
    import pynvml

    mod = types.ModuleType("stand_in_nvml")
    mod.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]
    mod.NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound  # type: ignore[attr-defined]
    mem = types.SimpleNamespace(used=615 << 20, total=143771 << 20, free=0)
    util = types.SimpleNamespace(gpu=0, memory=0)
    funcs = {
        "nvmlInit": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetMemoryInfo": lambda h: mem,
        "nvmlDeviceGetUtilizationRates": lambda h: util,
        "nvmlDeviceGetPowerUsage": lambda h: 79086,
        "nvmlDeviceGetTemperature": lambda h, s: 36,
        "nvmlDeviceGetClockInfo": lambda h, c: 345,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 1,
        "nvmlDeviceGetPcieThroughput": lambda h, c: 1072,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [],
    }
    for k, v in funcs.items():
        setattr(mod, k, v)
    return mod


def measure_recorder(seconds: float, interval: float, sampler: NvmlSampler) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gputune-bench-tele-") as tmp:
        events = EventLog(Path(tmp) / "events.jsonl")
        rec = Recorder(Path(tmp), events=events, interval=interval, sampler=sampler)
        c0, t0 = cpu_now(), time.monotonic()
        rec.start()
        time.sleep(seconds)
        rec.stop()
        c1, t1 = cpu_now(), time.monotonic()
        events.close()
    return {"cpu_s": c1 - c0, "wall_s": t1 - t0, "samples": rec.samples}


def measure_idle(seconds: float) -> dict[str, float]:
    c0, t0 = cpu_now(), time.monotonic()
    time.sleep(seconds)
    return {"cpu_s": cpu_now() - c0, "wall_s": time.monotonic() - t0}


def measure_dmon(seconds: float) -> dict[str, float] | None:
    if shutil.which("nvidia-smi") is None:
        return None
    import psutil

    proc = subprocess.Popen(
        ["nvidia-smi", "dmon", "-s", "pucvmet", "-o", "DT", "-d", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(seconds)
    p = psutil.Process(proc.pid)
    ct = p.cpu_times()
    wall = time.time() - p.create_time()
    proc.terminate()
    proc.wait(5)
    return {"cpu_s": ct.user + ct.system + ct.children_user + ct.children_system, "wall_s": wall}


def pct(m: dict[str, float]) -> float:
    return 100.0 * m["cpu_s"] / m["wall_s"] if m["wall_s"] > 0 else float("nan")


def parse_throughput() -> None:
    fixtures = REPO.parent / "shared" / "fixtures" / "gpu-oom"
    dmon = (fixtures / "oom-grow-dmon.txt").read_text() if fixtures.is_dir() else ""
    if dmon:
        big = dmon * 500
        t0 = time.perf_counter()
        n = len(parse_dmon(big))
        dt = time.perf_counter() - t0
        print(
            f"dmon parser: {n} samples in {dt:.3f} s = {n / dt:,.0f} samples/s"
            f" ({len(big) / dt / 1e6:.1f} MB/s)"
        )
    metrics = (REPO / "tests" / "fixtures" / "vllm-metrics.txt").read_text()
    t0 = time.perf_counter()
    for _ in range(200):
        parse_metrics(metrics)
    dt = (time.perf_counter() - t0) / 200
    print(
        f"/metrics parser: {dt * 1000:.2f} ms per scrape ({len(metrics.splitlines())} lines), "
        f"{100 * dt:.3f}% of one core at 1 Hz"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    real = NvmlSampler()
    on_gpu = real.open()
    sampler = real if on_gpu else NvmlSampler(stand_in_nvml())
    idle = measure_idle(args.seconds)
    rec10 = measure_recorder(args.seconds, 0.1, sampler)
    rec1 = measure_recorder(args.seconds, 1.0, sampler)
    print(f"NVML source: {'real GPU' if on_gpu else 'stand-in (no GPU here: ' + real.reason + ')'}")
    print(f"idle baseline (this process, sleeping)  {pct(idle):7.3f} % of one core")
    for name, m in (("recorder at 10 Hz", rec10), ("recorder at 1 Hz", rec1)):
        net = pct(m) - pct(idle)
        print(f"{name:<40} {pct(m):7.3f} % of one core ({net:+.3f} over idle, {m['samples']:.0f} samples)")
    dmon = measure_dmon(args.seconds) if on_gpu else None
    if dmon is not None:
        print(f"nvidia-smi dmon -d 1 subprocess         {pct(dmon):7.3f} % of one core")
        print(f"ratio recorder@10Hz / dmon@1Hz          {pct(rec10) / pct(dmon):7.3f}")
    else:
        cpu_json = GPU_CAPTURE / "cpu.json"
        if cpu_json.is_file():
            g = json.loads(cpu_json.read_text())
            d, r10 = g["dmon"]["cpu_percent_of_one_core"], g["rec10"]["cpu_percent_of_one_core"]
            print(
                f"H200 capture (bench/gpu/telemetry.sh): recorder@10Hz {r10:.3f} %, dmon@1Hz {d:.3f} %,"
                f" ratio {r10 / d:.3f}"
            )
        else:
            print(
                "no GPU here: the real-NVML numbers beside `nvidia-smi dmon` come from bench/gpu/telemetry.sh"
            )
    print(f"target: recorder at 10 Hz under 1% of one core: {'ok' if pct(rec10) < 1.0 else 'OVER'}")
    parse_throughput()
    return 0


if __name__ == "__main__":
    sys.exit(main())

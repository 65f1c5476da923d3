#!/usr/bin/env python3
"""Time `gputune doctor --format json` against the environment collectors people use today.

Both run as subprocesses in the same session, several times each; the medians and their ratio are
printed. The baseline is `python -m vllm.collect_env` when vLLM is importable by the chosen
Python, else `python -m torch.utils.collect_env`, else none (then only the doctor's time).

    python bench/doctor.py                      # this checkout, this interpreter
    python bench/doctor.py --python /opt/venv/bin/python --runs 5
    python bench/doctor.py --from ../shared/fixtures/hosts/h200-vm

Targets (README): doctor under 0.3 s on the development machine and under 0.5 s on an H200 host,
at least 20x faster than collect_env.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )
    return time.perf_counter() - start, proc.returncode


def importable(python: str, module: str, env: dict[str, str]) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", probe], env=env, capture_output=True, check=False).returncode == 0


def series(label: str, argv: list[str], runs: int, env: dict[str, str], timeout: float) -> float:
    times: list[float] = []
    for i in range(runs):
        t, rc = timed(argv, env, timeout)
        times.append(t)
        print(f"  {label} run {i + 1}: {t:.3f} s (exit {rc})", file=sys.stderr)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="interpreter to run both commands with")
    ap.add_argument("--runs", type=int, default=7, help="runs of the doctor (median taken)")
    ap.add_argument("--baseline-runs", type=int, default=3, help="runs of collect_env (it is slow)")
    ap.add_argument("--from", dest="source", help="diagnose this snapshot instead of the live host")
    ap.add_argument("--no-baseline", action="store_true", help="time the doctor only")
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    doctor = [args.python, "-m", "tuner", "doctor", "--format", "json"]
    if args.source:
        doctor += ["--from", args.source]
    timed(doctor, env, 120)  # warm the page cache and the .pyc files once, untimed
    doc_s = series("doctor", doctor, args.runs, env, 120)

    baseline: list[str] | None = None
    if not args.no_baseline:
        for module in ("vllm.collect_env", "torch.utils.collect_env"):
            if importable(args.python, module.split(".")[0], env):
                baseline = [args.python, "-m", module]
                break
    print(f"python:         {args.python}")
    print(f"gputune doctor: {doc_s:.3f} s median of {args.runs} (`{' '.join(doctor[1:])}`)")
    if baseline is None:
        print("baseline:       none (neither vllm nor torch importable, or --no-baseline)")
        return 0
    base_s = series(baseline[-1], baseline, args.baseline_runs, env, 600)
    print(f"{baseline[-1]}: {base_s:.3f} s median of {args.baseline_runs}")
    print(f"ratio:          doctor is {base_s / doc_s:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())

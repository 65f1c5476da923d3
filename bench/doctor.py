#!/usr/bin/env python3
"""Time `gputune doctor --format json` against the environment collectors people use today.

Both run as subprocesses in the same session, several times each, after one untimed warm-up run
each; the medians (wall clock, and the child's CPU time, which load from other processes disturbs
less) and their ratio are printed. The baseline is `python -m vllm.collect_env` when vLLM is
importable by the chosen Python, else `python -m torch.utils.collect_env`, else none (then only
the doctor's time).

Bytecode: the `tuner` package is byte-compiled first (`python -m compileall -q tuner`, as pip does
when it installs a wheel), so that a checkout copied without `__pycache__` (or a shell with
PYTHONDONTWRITEBYTECODE set) does not time the compiler. The script then says which of the
modules the doctor imports have bytecode; a dependency without it (a venv made by an installer
that does not compile, and PYTHONDONTWRITEBYTECODE set) is compiled at every run, by both
commands alike. `--pycache-prefix DIR` gives both commands a private bytecode cache
(PYTHONPYCACHEPREFIX) filled by their warm-up runs, as on a host whose packages were compiled at
install; nothing outside DIR and `tuner/__pycache__` is written.

    python bench/doctor.py                      # this checkout, this interpreter
    python bench/doctor.py --python /opt/venv/bin/python --runs 5
    python bench/doctor.py --pycache-prefix /tmp/gputune-pyc
    python bench/doctor.py --from ../shared/fixtures/hosts/h200-vm

Targets (README): doctor under 0.3 s on the development machine and under 0.5 s on an H200 host,
at least 20x faster than collect_env.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs a command module the way `python -m` does and, at exit, says for every module it imported
# from a .py file whether Python had bytecode for it: the pyc's header must match the source's
# mtime and size (or be hash-based).
BYTECODE_PROBE = r"""
import atexit, importlib.util, os, runpy, sys

def report():
    for name, mod in sorted(sys.modules.items()):
        origin = getattr(getattr(mod, "__spec__", None), "origin", None)
        if not origin or not origin.endswith(".py"):
            continue
        try:
            with open(importlib.util.cache_from_source(origin), "rb") as f:
                head = f.read(16)
            st = os.stat(origin)
            flags = int.from_bytes(head[4:8], "little")
            fresh = head[:4] == importlib.util.MAGIC_NUMBER and (flags != 0 or (
                int.from_bytes(head[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
                and int.from_bytes(head[12:16], "little") == st.st_size & 0xFFFFFFFF))
        except OSError:
            fresh = False
        print(name, "yes" if fresh else "no", file=sys.__stderr__)

atexit.register(report)
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def timed(argv: list[str], env: dict[str, str], timeout: float) -> tuple[float, float, int]:
    """(wall seconds, child CPU seconds, exit code) of one run.

    The child is reaped with a blocking wait4: subprocess.run(timeout=...) polls with sleeps of up
    to 50 ms, which rounds every measurement up to the next 50 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        killer.cancel()
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


def importable(python: str, module: str, env: dict[str, str]) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", probe], env=env, capture_output=True, check=False).returncode == 0


def compile_tuner(python: str, env: dict[str, str]) -> bool:
    proc = subprocess.run(
        [python, "-m", "compileall", "-q", str(REPO / "tuner")],
        env=env,
        cwd=REPO,
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def bytecode_report(argv: list[str], env: dict[str, str]) -> str:
    """Run ``python -m MODULE ARGS`` once (untimed: it also warms the caches), check that it printed a
    report, and say which of the modules it imported Python loaded from bytecode and which it compiled."""
    assert argv[1] == "-m"
    proc = subprocess.run(
        [argv[0], "-c", BYTECODE_PROBE, *argv[2:]],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    try:  # the doctor must have answered: one JSON object with a schema_version
        answered = "schema_version" in json.loads(proc.stdout)
    except ValueError:
        answered = False
    if not answered:
        tail = "\n".join(ln for ln in proc.stderr.splitlines() if not ln.endswith((" yes", " no")))
        raise SystemExit(
            f"bench: `{' '.join(argv)}` gave no report (exit {proc.returncode}):\n{tail[-2000:]}"
        )
    states = dict(line.split(" ", 1) for line in proc.stderr.splitlines() if line.endswith((" yes", " no")))
    missing = sorted(n for n, state in states.items() if state == "no")
    line = f"{len(states) - len(missing)} of {len(states)} imported Python modules have bytecode"
    if missing:
        shown = ", ".join(missing[:12]) + (f" and {len(missing) - 12} more" if len(missing) > 12 else "")
        line += f"; compiled at every run: {shown}"
    return line


def series(
    label: str, argv: list[str], runs: int, env: dict[str, str], timeout: float, ok: tuple[int, ...]
) -> tuple[float, float]:
    """Median wall and CPU seconds of ``runs`` runs; SystemExit when a run exits with a code not in ``ok``
    (a command that fails at once would otherwise look fast)."""
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(runs):
        wall, cpu, rc = timed(argv, env, timeout)
        walls.append(wall)
        cpus.append(cpu)
        print(f"  {label} run {i + 1}: {wall:.3f} s wall, {cpu:.3f} s cpu (exit {rc})", file=sys.stderr)
        if rc not in ok:
            err = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, check=False).stderr
            raise SystemExit(
                f"bench: `{' '.join(argv)}` exited {rc}; not timing a failing command\n{err[-2000:]}"
            )
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=sys.executable, help="interpreter to run both commands with")
    ap.add_argument("--runs", type=int, default=7, help="runs of the doctor (median taken)")
    ap.add_argument("--baseline-runs", type=int, default=3, help="runs of collect_env (it is slow)")
    ap.add_argument("--from", dest="source", help="diagnose this snapshot instead of the live host")
    ap.add_argument("--no-baseline", action="store_true", help="time the doctor only")
    ap.add_argument("--no-compile", action="store_true", help="do not byte-compile tuner/ first")
    ap.add_argument(
        "--pycache-prefix",
        metavar="DIR",
        help="give both commands a bytecode cache in DIR (PYTHONPYCACHEPREFIX), filled by the warm-up runs",
    )
    args = ap.parse_args()

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if args.pycache_prefix:
        env["PYTHONPYCACHEPREFIX"] = str(Path(args.pycache_prefix).resolve())
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    compiled = False if args.no_compile else compile_tuner(args.python, env)
    doctor = [args.python, "-m", "tuner", "doctor", "--format", "json"]
    if args.source:
        doctor += ["--from", args.source]
    # Untimed warm-up: page cache, and the bytecode cache when one is written; lists the imports.
    bytecode = bytecode_report(doctor, env)
    doc_wall, doc_cpu = series("doctor", doctor, args.runs, env, 120, ok=(0, 1))

    baseline: list[str] | None = None
    if not args.no_baseline:
        for module in ("vllm.collect_env", "torch.utils.collect_env"):
            if importable(args.python, module.split(".")[0], env):
                baseline = [args.python, "-m", module]
                break
    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    print(f"python:         {args.python}")
    print(f"host:           {os.cpu_count()} CPUs, {load}")
    print(f"compileall:     {'tuner/ byte-compiled' if compiled else 'not run (--no-compile) or failed'}")
    if args.pycache_prefix:
        print(f"pycache prefix: {env['PYTHONPYCACHEPREFIX']} (both commands, warmed once)")
    print(f"bytecode:       {bytecode}")
    print(
        f"gputune doctor: {doc_wall:.3f} s median of {args.runs} ({doc_cpu:.3f} s cpu)"
        f" (`{' '.join(doctor[1:])}`)"
    )
    if baseline is None:
        print("baseline:       none (neither vllm nor torch importable, or --no-baseline)")
        return 0
    timed(baseline, env, 600)  # warm-up, untimed, like the doctor's
    base_wall, base_cpu = series(baseline[-1], baseline, args.baseline_runs, env, 600, ok=(0,))
    print(f"{baseline[-1]}: {base_wall:.3f} s median of {args.baseline_runs} ({base_cpu:.3f} s cpu)")
    print(
        f"ratio:          doctor is {base_wall / doc_wall:.1f}x faster (cpu time: {base_cpu / doc_cpu:.1f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

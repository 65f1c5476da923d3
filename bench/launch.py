"""gputune's own overhead in `gputune launch`, against vLLM's own start time, on the tiny model.

Two numbers are gputune's (the target: under 1 s together):
- command -> exec: from the moment the command is run (this script's clock before it spawns
  `python -m tuner launch`, and the process's own start time) to the moment vLLM's process was
  started (the ``exec`` event): Python start-up, imports, plan, doctor, port check;
- ready delay: from vLLM's "Application startup complete" line appearing in vllm.log (watched here
  independently, every 5 ms) to gputune's ``ready`` event.
The baseline is vLLM's own start: exec -> "Application startup complete".

Usage: .venv/bin/python bench/launch.py [--model DIR] [--runs N]   (each run starts vLLM: ~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.rundir import read_events  # noqa: E402

LINE = b"Application startup complete"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def watch_line(path: Path, found: dict[str, float], stop: threading.Event) -> None:
    pos = 0
    while not stop.is_set():
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                data = fh.read()
        except OSError:
            data = b""
        if data:
            if LINE in data:
                found["line"] = time.time()
                return
            pos += max(0, len(data) - len(LINE))
        stop.wait(0.005)


def one_run(model: Path, workdir: Path, i: int) -> dict[str, float]:
    run = workdir / f"run{i}"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env["PYTHONPATH"] = str(REPO)
    found: dict[str, float] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_line, args=(run / "vllm.log", found, stop), daemon=True)
    watcher.start()
    t_cmd = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "launch",
            "--model",
            str(model),
            "--port",
            str(free_port()),
            "--run-dir",
            str(run),
            "--exit-when-ready",
            "--no-smoke",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    stop.set()
    if proc.returncode != 0:
        raise SystemExit(f"launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    ev = {e["kind"]: e for e in read_events(run / "events.jsonl")}
    start, exec_, ready = ev["start"], ev["exec"], ev["ready"]
    age_at_main = float(start["data"].get("process_age_at_main_s") or 0.0)
    main_to_exec = float(exec_["data"]["overhead_s"])
    line_t = found.get("line")
    if line_t is None:
        raise SystemExit("never saw the startup line in vllm.log")
    return {
        "command_to_exec_s": exec_["time"] - t_cmd,
        "process_start_to_exec_s": age_at_main + main_to_exec,
        "python_and_imports_s": age_at_main,
        "plan_doctor_checks_s": main_to_exec,
        "ready_delay_s": ready["time"] - line_t,
        "ready_delay_own_s": float(ready["data"].get("ready_delay_s") or 0.0),
        "vllm_start_s": line_t - exec_["time"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="a model folder (default: generate the tiny Llama)")
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gputune-bench-launch-") as tmp:
        work = Path(tmp)
        model = args.model
        if model is None:
            from tests.tinymodel import make_tiny_llama

            model = make_tiny_llama(work / "tiny-llama")
        results = [one_run(model, work, i) for i in range(args.runs)]
    for i, r in enumerate(results):
        overhead = r["command_to_exec_s"] + r["ready_delay_s"]
        print(f"run {i + 1}:")
        print(f"  command -> exec of vLLM        {r['command_to_exec_s']:8.3f} s")
        print(f"    of which python + imports    {r['python_and_imports_s']:8.3f} s")
        print(f"    of which plan, doctor, port  {r['plan_doctor_checks_s']:8.3f} s")
        print(
            f"  startup line -> ready          {r['ready_delay_s']:8.3f} s (gputune's own count: "
            f"{r['ready_delay_own_s']:.3f} s)"
        )
        print(
            f"  gputune overhead, total        {overhead:8.3f} s  (target < 1 s: "
            f"{'ok' if overhead < 1.0 else 'OVER'})"
        )
        print(f"  baseline: vLLM's own start     {r['vllm_start_s']:8.3f} s")
        print(f"  ratio overhead / vLLM start    {overhead / r['vllm_start_s']:8.4f}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

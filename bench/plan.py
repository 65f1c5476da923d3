"""How long `gputune plan` takes, next to baselines measured in the same run, and the calibration table.

Target: plan computation under 50 ms. Printed side by side:
  - json.loads of a model's config.json (the least any planner must do),
  - the plan's pure arithmetic (tuner.plan.compute_plan) for GPU and CPU targets,
  - build_plan against a snapshot host (reads meminfo, NUMA nodes, GPUs, the cached vLLM flags),
  - the whole CLI in a fresh interpreter, next to a bare `python -c pass` start.
Then the calibration: plan kv_cache_tokens against real vLLM start-up logs (tests/calibration/).

Usage: PYTHONPATH=. .venv/bin/python bench/plan.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.host import Host  # noqa: E402
from tuner.models import load_profiles, resolve_model  # noqa: E402
from tuner.plan import PlanRequest, build_plan, compute_plan, gather_facts  # noqa: E402

SHARED = Path(os.environ.get("GPUTUNE_SHARED", REPO.parent / "shared")) / "fixtures"
TARGET_MS = 50.0


def median_ms(fn: Callable[[], object], n: int) -> float:
    fn()  # warm caches (profiles, help cache) once; cold start is measured by the CLI row
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    spec = load_profiles()["qwen72b-gptq"]
    config_text = json.dumps(spec.to_dict())
    # the captured CPU VM when the shared fixtures are here, else this machine
    snap = SHARED / "hosts" / "cpu-vm"
    host = Host.at(snap) if snap.is_dir() else Host.live_host()
    rows: list[tuple[str, float]] = []
    rows.append(("baseline: json.loads(config.json)", median_ms(lambda: json.loads(config_text), 2000)))
    req48 = PlanRequest("qwen72b-gptq", gpu_mem="48GiB")
    req24 = PlanRequest("qwen72b-gptq", gpu_mem="24GiB")
    req8 = PlanRequest("qwen72b-gptq", gpu_mem="8GiB")
    reqcpu = PlanRequest("qwen2.5-7b")
    facts48 = gather_facts(req48, host)
    facts24 = gather_facts(req24, host)
    facts8 = gather_facts(req8, host)
    factscpu = gather_facts(reqcpu, host)
    rows.append(
        ("compute_plan qwen72b-gptq 48 GiB", median_ms(lambda: compute_plan(req48, spec, facts48), 200))
    )
    rows.append(
        (
            "compute_plan qwen72b-gptq 24 GiB (offload)",
            median_ms(lambda: compute_plan(req24, spec, facts24), 200),
        )
    )
    rows.append(
        (
            "compute_plan qwen72b-gptq 8 GiB (refused + nearest)",
            median_ms(lambda: compute_plan(req8, spec, facts8), 100),
        )
    )
    rows.append(
        (
            "compute_plan qwen2.5-7b CPU backend",
            median_ms(lambda: compute_plan(reqcpu, resolve_model("qwen2.5-7b"), factscpu), 200),
        )
    )
    rows.append(
        ("build_plan on a snapshot host (facts + plan)", median_ms(lambda: build_plan(req48, host), 50))
    )

    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def cli() -> object:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "tuner",
                "plan",
                "--model",
                "qwen72b-gptq",
                "--gpu-mem",
                "48GiB",
                "--format",
                "json",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            check=True,
        )

    def bare() -> object:
        return subprocess.run([sys.executable, "-c", "pass"], capture_output=True, check=True)

    base_start = median_ms(bare, 5)
    cli_ms = median_ms(cli, 5)

    print(f"{'what':55} {'median ms':>10} {'x json.loads':>13}")
    base = rows[0][1]
    for name, ms in rows:
        print(f"{name:55} {ms:10.3f} {ms / base:13.0f}")
    print(f"{'baseline: python -c pass (interpreter start)':55} {base_start:10.1f}")
    print(
        f"{'gputune plan CLI, fresh interpreter':55} {cli_ms:10.1f}"
        f"   ({cli_ms / base_start:.1f}x python -c pass)"
    )
    worst = max(ms for name, ms in rows[1:])
    print(
        f"\nplan computation target < {TARGET_MS:.0f} ms: worst in-process {worst:.2f} ms ->"
        f" {'PASS' if worst < TARGET_MS else 'FAIL'}"
    )

    sys.path.insert(0, str(REPO / "tests"))
    from tests.calibration.cases import format_report, report

    print("\ncalibration: plan kv_cache_tokens vs real vLLM start-up logs (tests/calibration/)")
    print(format_report(report()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

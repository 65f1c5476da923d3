"""Real vLLM GPU start-up logs from public issue threads, and the plan's prediction for each.

Each case is ``<name>.log`` (the lines as the user pasted them) and ``<name>.toml``
(source URL, the run's configuration, the values vLLM logged). :func:`predict` runs the
plan's pure arithmetic (``tuner.plan.compute_plan``) for the same card, model and
arguments; the calibration test and ``bench/plan.py`` print how far it lands.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.models import ModelSpec, load_profiles, spec_from_profile
from tuner.plan import Device, HostFacts, Plan, PlanRequest, compute_plan
from tuner.vllm_cli import VllmHelp

HERE = Path(__file__).resolve().parent
GiB = 1 << 30


@dataclass(frozen=True)
class Case:
    name: str
    data: dict[str, Any]
    log: str

    @property
    def run(self) -> dict[str, Any]:
        return dict(self.data["run"])

    @property
    def logged(self) -> dict[str, Any]:
        return dict(self.data["logged"])

    def spec(self) -> ModelSpec:
        profile = self.run.get("profile")
        if profile:
            return load_profiles()[profile]
        return spec_from_profile(self.name, self.data, str(HERE / f"{self.name}.toml"))

    def logged_tokens(self) -> int:
        """Tokens vLLM reported: "GPU KV cache size: N tokens", "# GPU blocks: N" x 16, or from the GiB."""
        lg = self.logged
        if "kv_cache_tokens" in lg:
            return int(lg["kv_cache_tokens"])
        if "gpu_blocks" in lg:
            return int(lg["gpu_blocks"]) * 16
        from tuner.models import kv_bytes_per_token

        per_block = kv_bytes_per_token(self.spec(), 2, int(self.run.get("tensor_parallel_size", 1))) * 16
        return int(lg["kv_cache_gib"] * GiB) // per_block * 16


def load_cases() -> list[Case]:
    cases = []
    for toml in sorted(HERE.glob("*.toml")):
        log = toml.with_suffix(".log")
        cases.append(
            Case(toml.stem, tomllib.loads(toml.read_text()), log.read_text() if log.exists() else "")
        )
    return cases


def log_numbers(text: str) -> dict[str, int]:
    """The KV capacity lines of a vLLM log: "GPU KV cache size: 268,560 tokens", "# GPU blocks: 1381"."""
    out: dict[str, int] = {}
    if m := re.search(r"GPU KV cache size: ([\d,]+) tokens", text):
        out["kv_cache_tokens"] = int(m.group(1).replace(",", ""))
    if m := re.search(r"GPU blocks: (\d+)", text):
        out["gpu_blocks"] = int(m.group(1))
    if m := re.search(r"kv_cache_size=([\d.]+)GiB|available_kv_cache_memory\s+([\d.]+)GiB", text):
        out["kv_cache_centigib"] = round(float(m.group(1) or m.group(2)) * 100)
    return out


def predict(case: Case) -> Plan:
    run = case.run
    total = int(run["total_gib"] * GiB)
    tp = int(run.get("tensor_parallel_size", 1))
    dev = Device(run["gpu"], tp, total, total, None, None, None, None, "calibration")
    facts = HostFacts(
        dev, "", 1 << 40, None, None, "", VllmHelp("vllm", str(run["vllm_version"]), {}, "calibration")
    )
    extra = [
        "--gpu-memory-utilization", str(run["gpu_memory_utilization"]),
        "--max-model-len", str(run["max_model_len"]),
        "--max-num-batched-tokens", str(run["max_num_batched_tokens"]),
        "--max-num-seqs", str(run["max_num_seqs"]),
        "--kv-cache-dtype", str(run.get("kv_cache_dtype", "auto")),
    ]  # fmt: skip
    if tp > 1:
        extra += ["--tensor-parallel-size", str(tp)]
    env: dict[str, str] = {}
    if run.get("cuda_graphs_subtracted") is False:
        env["VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS"] = "0"
    if run.get("engine") == "v1":
        env["VLLM_USE_V1"] = "1"
    req = PlanRequest(model=case.name, extra_args=tuple(extra), env=env)
    return compute_plan(req, case.spec(), facts)


def planned_tokens(case: Case, plan: Plan) -> int:
    """The plan's capacity in the unit the log used: whole blocks x 16 for "# GPU blocks" logs (vLLM V0
    reported blocks, not the max_model_len-rounded token count vLLM 0.32 logs)."""
    if "gpu_blocks" in case.logged or case.run.get("tokens_reported") == "blocks":
        return plan.kv_cache_bytes // (16 * plan.kv_bytes_per_token) * 16
    return plan.kv_cache_tokens


def report() -> list[tuple[str, int, int, float]]:
    """(case, logged tokens, planned tokens, relative error) for every case."""
    rows = []
    for case in load_cases():
        planned = planned_tokens(case, predict(case))
        logged = case.logged_tokens()
        rows.append((case.name, logged, planned, (planned - logged) / logged))
    return rows


def format_report(rows: list[tuple[str, int, int, float]]) -> str:
    lines = [f"{'case':40} {'vLLM logged':>12} {'plan':>12} {'error':>8}"]
    for name, logged, planned, err in rows:
        lines.append(f"{name:40} {logged:>12,} {planned:>12,} {err:>+8.1%}")
    return "\n".join(lines)

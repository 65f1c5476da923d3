"""The model a crashed run was loading, and how many bytes its weights take, for triage's remedy of
``oom_weights_do_not_fit``.

Where the model's name comes from: a `gputune launch` run directory's plan.json (``model_name``) or
command.json (``--model``, or the positional model of ``vllm serve``), else the log's configuration
lines (vLLM's ``non-default args: {'model': ...}``, vllm/entrypoints/utils.py log_non_default_args;
``Initializing a V1 LLM engine (v...) with config: model='...', dtype=..., quantization=...,
tensor_parallel_size=...``, vllm/v1/engine/core.py; V0 ``Initializing an LLM engine (v...) with
config: model=...``, vllm/engine/llm_engine.py).

How the bytes are counted: tuner.models resolves the name (built-in profile, local folder, Hugging
Face cache) and counts the weights from safetensors headers or config.json shapes x quantization.
When the name cannot be resolved on this machine (a path or repo id only the crashed host had), the
parameter count in the name ("70B", "72B"; "8x7B" as a floor of 0.75 x 8 x 7) times the bytes per
parameter of the logged dtype / quantization gives an estimate, and says so.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = float(2**30)
# bytes per parameter of a whole checkpoint, embeddings included (they stay 16-bit when the linear
# layers are quantized: ~3-5% of a 7B-70B model, hence a little above the linear layers' own width)
BYTES_PER_PARAM = {"16bit": 2.0, "32bit": 4.0, "fp8": 1.05, "int4": 0.6, "int8": 1.05}
_PARAMS = re.compile(r"(?:^|[-_/\s.])(\d+(?:\.\d+)?)\s*[bB](?=$|[-_/\s.])")
_MOE_NAME = re.compile(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*[bB]", re.IGNORECASE)
_QUANT_IN_NAME = (
    ("awq", "int4"),
    ("gptq", "int4"),
    ("int4", "int4"),
    ("4bit", "int4"),
    ("w4a16", "int4"),
    ("nvfp4", "int4"),
    ("bnb", "int4"),
    ("fp8", "fp8"),
    ("w8a8", "int8"),
    ("int8", "int8"),
)
UNQUANTIZED_NAMES = frozenset({"", "none", "null"})


@dataclass(frozen=True)
class ModelWeights:
    """The weights of the model a run loaded: bytes in all GPUs together, and how they were counted."""

    name: str
    total_bytes: float
    how: str  # "profile llama3-70b: shapes from config.json x quantization" | "estimate: ..."
    estimate: bool  # True: from the parameter count in the name, not from the model's files
    unquantized: bool  # 16-bit (or 32-bit) weights: --quantization fp8 would convert them at load
    fp8_bytes: float | None  # the same model with --quantization fp8 (None when it does not apply)
    int4_bytes: float | None  # a 4-bit AWQ/GPTQ checkpoint of the same model
    heads: int | None = None  # num_attention_heads (config.json): --tensor-parallel-size must divide it


def model_name(argv: list[str], logged: Mapping[str, Any], plan: Mapping[str, Any]) -> str | None:
    """The model the run loaded: plan.json, then the command line, then vLLM's logged arguments."""
    for key in ("model_name", "model_path"):
        value = plan.get(key)
        if isinstance(value, str) and value:
            return value
    for i, tok in enumerate(argv):
        if tok.startswith("--model="):
            return tok.split("=", 1)[1] or None
        if tok == "--model" and i + 1 < len(argv):
            return argv[i + 1]
    for i, tok in enumerate(argv[:-1]):
        if tok == "serve" and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    for key in ("model", "model_tag"):
        value = logged.get(key)
        if isinstance(value, str) and value:
            return value
    return None


# A mixture of experts named 'NxMB' shares its attention and embeddings among the experts, so it holds
# fewer than N x M billion parameters: Mixtral-8x7B 46.7B (0.83 of 56), Mixtral-8x22B 141B (0.80 of
# 176). This share of the product is a floor, good for 'the weights alone exceed the card'.
MOE_SHARE_FLOOR = 0.75


def params_from_name(name: str) -> float | None:
    """Parameters in billions from a repo name ('Llama-2-70b-hf' -> 70, 'Qwen2-VL-72B' -> 72; a
    mixture of experts 'Mixtral-8x7B' -> at least 42); None when the name holds no count."""
    base = name.rstrip("/")
    moe = _MOE_NAME.search(base.rsplit("/", 1)[-1]) or _MOE_NAME.search(base)
    if moe:
        return round(int(moe.group(1)) * float(moe.group(2)) * MOE_SHARE_FLOOR, 1)
    m = _PARAMS.search(base.rsplit("/", 1)[-1]) or _PARAMS.search(base)
    return float(m.group(1)) if m else None


def _scheme_from(name: str, dtype: Any, quantization: Any) -> tuple[str, str]:
    """('16bit'|'32bit'|'fp8'|'int4'|'int8', what said so) from the logged arguments or the name."""
    q = str(quantization or "").strip("'\"").lower()
    if q not in UNQUANTIZED_NAMES:
        if "fp8" in q or "fp4" in q:
            return ("fp8" if "fp8" in q else "int4"), f"quantization={q}"
        if q in ("awq", "gptq", "awq_marlin", "gptq_marlin", "bitsandbytes", "compressed-tensors", "marlin"):
            return "int4", f"quantization={q} (assumed 4-bit)"
        return "int8", f"quantization={q} (assumed 8-bit)"
    low = name.lower()
    for word, scheme in _QUANT_IN_NAME:
        if word in low:
            return scheme, f"'{word}' in the name"
    d = str(dtype or "").lower()
    if "float32" in d or d == "float":
        return "32bit", "dtype=float32"
    return "16bit", (f"dtype={d.removeprefix('torch.')}" if d and d != "auto" else "16-bit assumed")


def estimate_from_name(name: str, dtype: Any = None, quantization: Any = None) -> ModelWeights | None:
    """Weights bytes from the parameter count in the name x bytes per parameter of the scheme."""
    billions = params_from_name(name)
    if billions is None:
        return None
    scheme, why = _scheme_from(name, dtype, quantization)
    params = billions * 1e9
    total = params * BYTES_PER_PARAM[scheme]
    unq = scheme in ("16bit", "32bit")
    return ModelWeights(
        name=name,
        total_bytes=total,
        how=(
            f"estimate: {'at least ' if _MOE_NAME.search(name) else ''}{billions:g}B parameters "
            f"(from the name) x {BYTES_PER_PARAM[scheme]:g} bytes "
            f"({scheme}, {why})"
        ),
        estimate=True,
        unquantized=unq,
        fp8_bytes=params * BYTES_PER_PARAM["fp8"] if unq else None,
        int4_bytes=params * BYTES_PER_PARAM["int4"] if scheme not in ("int4",) else None,
    )


def _resolve(name: str, env: Mapping[str, str]) -> Any:
    """tuner.models.resolve_model, then a path's last two parts as a Hub id; None when neither works."""
    from tuner.errors import GputuneError
    from tuner.models import load_profiles, resolve_model

    tries = [name]
    parts = [p for p in name.rstrip("/").split("/") if p]
    if len(parts) > 2:
        tries.append("/".join(parts[-2:]))
    for t in tries:
        try:
            return resolve_model(t, env)
        except (GputuneError, OSError, ValueError, KeyError, TypeError):
            continue
    if parts:  # a local copy of a profile's repo: same folder name as the repo
        base = parts[-1].lower()
        for prof in load_profiles().values():
            if prof.hf_id and prof.hf_id.rsplit("/", 1)[-1].lower() == base:
                return prof
    return None


def model_weights(
    name: str,
    env: Mapping[str, str] | None = None,
    dtype: Any = None,
    quantization: Any = None,
) -> ModelWeights | None:
    """The weights of ``name``: counted by tuner.models when it resolves here, else estimated from the
    name (None when neither is possible)."""
    full_env = {**os.environ, **(env or {})}
    spec = _resolve(name, full_env)
    if spec is None:
        return estimate_from_name(name, dtype, quantization)
    from tuner.models import QuantSpec, weight_estimate

    q = str(quantization or "").lower()
    load_q = "fp8" if q == "fp8" else None
    est = weight_estimate(spec, load_q)
    unq = spec.quant is None and q in UNQUANTIZED_NAMES
    fp8 = float(weight_estimate(spec, "fp8").total_bytes) if unq else None
    int4 = None
    if spec.quant is None or (spec.quant.bits or 16) > 4:
        shaped = dataclasses.replace(spec, quant=QuantSpec("awq", bits=4, group_size=128), tensors=())
        int4 = float(weight_estimate(shaped).total_bytes)
    return ModelWeights(
        name=name,
        total_bytes=float(est.total_bytes),
        how=f"{spec.origin} {spec.name}: {est.method}, {est.scheme}",
        estimate=False,
        unquantized=unq,
        fp8_bytes=fp8,
        int4_bytes=int4,
        heads=spec.num_attention_heads or None,
    )


# GPU names -> compute capability class: the FP8 tensor cores start at sm_89 (Ada) and sm_90 (Hopper)
_FP8_GPUS = re.compile(
    r"\b(?:H100|H200|H800|H20|GH200|B100|B200|GB200|B300|L40S?|L4|L20|RTX\s*40\d0|RTX\s*50\d0|"
    r"RTX\s*(?:PRO\s*)?6000\s*(?:Ada|Blackwell)|RTX\s*\d000\s*Ada|Ada|Hopper|Blackwell)\b",
    re.IGNORECASE,
)
_OLDER_GPUS = re.compile(
    r"\b(?:A100|A800|A10G?|A30|A40|A16|A2|A6000|RTX\s*30\d0|RTX\s*20\d0|V100|T4|P100|P40|Ampere|Turing|Volta)\b",
    re.IGNORECASE,
)


def capability_from_name(gpu: str) -> tuple[int, int] | None:
    """A representative compute capability for a GPU model name: (8, 9) or above for FP8-capable
    Ada/Hopper/Blackwell parts, (8, 0) for the older ones (only the sm_89 boundary matters here)."""
    if _FP8_GPUS.search(gpu):
        return (9, 0) if re.search(r"H\d|GH|B\d|Hopper|Blackwell", gpu, re.IGNORECASE) else (8, 9)
    if _OLDER_GPUS.search(gpu):
        return (8, 0)
    return None

"""Model specs: the architecture numbers the memory plan needs, and where each came from.

A model is named in one of three ways (:func:`resolve_model`):

- a built-in profile, ``playbooks/models/<name>.toml``: the numbers of a public
  checkpoint's ``config.json`` (and quantization config), each with its source;
- a local model folder: its ``config.json``, its quantization config
  (``quantization_config`` inside ``config.json``, else ``quantize_config.json``
  or ``quant_config.json``) and the headers of its ``*.safetensors`` files;
- a model id already in the local Hugging Face cache
  (``$HF_HUB_CACHE`` or ``$HF_HOME/hub`` or ``~/.cache/huggingface/hub``,
  ``models--org--name/snapshots/<rev>/``).

Safetensors headers give the exact bytes of every stored tensor without loading
any: a file starts with an 8-byte little-endian header length, then a JSON
header mapping tensor names to ``{"dtype", "shape", "data_offsets"}``.

Nothing here imports torch, transformers or vLLM.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import UsageError

# Bytes per element of torch dtype names as config.json spells them.
TORCH_DTYPE_BYTES: dict[str, int] = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1,
}  # fmt: skip

_HEADER_MAX = 100 << 20  # the safetensors reference implementation refuses headers above 100 MB
_CONFIG_MAX = 4 << 20


@dataclass(frozen=True)
class QuantSpec:
    """How the checkpoint's linear layers are stored (config.json ``quantization_config``)."""

    method: str  # quant_method: "gptq" | "awq" | "fp8" | "compressed-tensors" | ...
    bits: int | None = None  # "bits" / "w_bit"
    group_size: int | None = None  # "group_size" / "q_group_size"; -1 or None = per channel
    desc_act: bool | None = None  # GPTQ act-order: checkpoint carries g_idx that vLLM keeps
    sym: bool | None = None  # GPTQ symmetric
    zero_point: bool | None = None  # AWQ zero point
    modules_in_16bit: tuple[str, ...] = ()  # modules_to_not_convert / ignore: left in 16-bit
    source: str = ""  # where these numbers came from

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "zero_point": self.zero_point,
            "modules_in_16bit": list(self.modules_in_16bit),
            "source": self.source,
        }


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors header: name, dtype name, shape, stored bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int  # data_offsets[1] - data_offsets[0]


@dataclass(frozen=True)
class ModelSpec:
    """A model's architecture numbers (config.json) and quantization, with the source of each."""

    name: str  # profile name, folder path or HF id as the user gave it
    hf_id: str | None  # the Hugging Face repo id vLLM would load
    path: str | None  # local folder, when there is one (what --model gets)
    origin: str  # "profile" | "folder" | "hf-cache"
    architecture: str  # config.json "architectures"[0]
    model_type: str  # config.json "model_type"
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int  # config.json "head_dim", else hidden_size / num_attention_heads
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    torch_dtype: str  # config.json "torch_dtype" (or "dtype" in transformers >= 4.56)
    attention_bias: bool = False  # q/k/v biases (Qwen2 has them)
    sliding_window: int | None = None  # only when the model applies it (use_sliding_window)
    kv_lora_rank: int | None = None  # MLA (DeepSeek-V2/V3): cached latent size
    qk_rope_head_dim: int | None = None  # MLA: rope part cached beside the latent
    quant: QuantSpec | None = None
    tensors: tuple[TensorInfo, ...] = ()  # from safetensors headers, when the files are here
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=dict)  # field -> where it came from

    @property
    def checkpoint_bytes(self) -> int | None:
        """Exact bytes of all stored tensors (sum over the safetensors headers), None without files."""
        return sum(t.nbytes for t in self.tensors) if self.tensors else None

    @property
    def dtype_bytes(self) -> int:
        return TORCH_DTYPE_BYTES.get(self.torch_dtype, 2)

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hf_id": self.hf_id,
            "path": self.path,
            "origin": self.origin,
            "architecture": self.architecture,
            "model_type": self.model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": self.torch_dtype,
            "attention_bias": self.attention_bias,
            "sliding_window": self.sliding_window,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "quantization": self.quant.to_dict() if self.quant else None,
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_tensors": len(self.tensors) or None,
            "sources": dict(self.sources),
        }


# --------------------------------------------------------------------------------------------------
# config.json -> ModelSpec
# --------------------------------------------------------------------------------------------------
_ARCH_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
    "torch_dtype",
)


def _int(cfg: Mapping[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{where}: {key!r} is missing or not a positive integer ({value!r})")
    return value


def quant_from_config(qc: Mapping[str, Any] | None, source: str) -> QuantSpec | None:
    """Read a ``quantization_config`` / ``quantize_config.json`` / ``quant_config.json`` mapping."""
    if not qc:
        return None
    method = str(
        qc.get("quant_method") or ("awq" if "w_bit" in qc else "gptq" if "bits" in qc else "unknown")
    )
    bits = qc.get("bits", qc.get("w_bit"))
    group = qc.get("group_size", qc.get("q_group_size"))
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        first: Any = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
        weights = first.get("weights") or {} if isinstance(first, dict) else {}
        bits = weights.get("num_bits", bits)
        group = weights.get("group_size", group)
        if weights.get("type") == "float" and bits == 8:
            method = "fp8"
    skip = qc.get("modules_to_not_convert") or qc.get("ignore") or ()
    return QuantSpec(
        method=method,
        bits=int(bits) if isinstance(bits, (int, float)) and not isinstance(bits, bool) else None,
        group_size=int(group) if isinstance(group, int) and not isinstance(group, bool) else None,
        desc_act=bool(qc["desc_act"]) if "desc_act" in qc else None,
        sym=bool(qc["sym"]) if "sym" in qc else None,
        zero_point=bool(qc["zero_point"]) if "zero_point" in qc else None,
        modules_in_16bit=tuple(str(m) for m in skip) if isinstance(skip, (list, tuple)) else (),
        source=source,
    )


def spec_from_config(
    cfg: Mapping[str, Any],
    *,
    name: str,
    hf_id: str | None,
    path: str | None,
    origin: str,
    where: str,
    quant: QuantSpec | None = None,
    tensors: tuple[TensorInfo, ...] = (),
    sources: Mapping[str, str] | None = None,
    description: str = "",
) -> ModelSpec:
    """Build a spec from config.json's fields (nested ``text_config`` for multimodal wrappers)."""
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg["text_config"], **{k: v for k, v in cfg.items() if k == "quantization_config"}}
    heads = _int(cfg, "num_attention_heads", where)
    hidden = _int(cfg, "hidden_size", where)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    archs = cfg.get("architectures") or ["?"]
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    use_sw = cfg.get("use_sliding_window", cfg.get("sliding_window") is not None)
    window = cfg.get("sliding_window") if use_sw else None
    if quant is None:
        quant = quant_from_config(cfg.get("quantization_config"), f"{where} quantization_config")
    src = dict(sources or {})
    for key in _ARCH_FIELDS:
        src.setdefault(key, where if key in cfg else f"derived ({where} has no {key!r})")
    return ModelSpec(
        name=name,
        hf_id=hf_id,
        path=path,
        origin=origin,
        architecture=str(archs[0]),
        model_type=str(cfg.get("model_type", "?")),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_hidden_layers=_int(cfg, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        vocab_size=_int(cfg, "vocab_size", where),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        torch_dtype=dtype,
        attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") in ("qwen2",))),
        sliding_window=int(window) if isinstance(window, int) and window > 0 else None,
        kv_lora_rank=cfg.get("kv_lora_rank"),
        qk_rope_head_dim=cfg.get("qk_rope_head_dim"),
        quant=quant,
        tensors=tensors,
        description=description,
        sources=src,
    )


# --------------------------------------------------------------------------------------------------
# safetensors headers
# --------------------------------------------------------------------------------------------------
def parse_safetensors_header(blob: bytes) -> dict[str, Any]:
    """Parse the JSON header of a safetensors file from its first bytes (length prefix included)."""
    if len(blob) < 8:
        raise ValueError("file shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > _HEADER_MAX:
        raise ValueError(f"header length {n} is above the 100 MB safetensors limit")
    if len(blob) < 8 + n:
        raise ValueError("file ends inside its header")
    header = json.loads(blob[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def read_safetensors_header(path: Path) -> tuple[TensorInfo, ...]:
    """The tensors of one safetensors file, read from its header only (no tensor data is read)."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError("file shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        if n > _HEADER_MAX:
            raise ValueError(f"header length {n} is above the 100 MB safetensors limit")
        header = parse_safetensors_header(head + fh.read(n))
    size = path.stat().st_size
    out: list[TensorInfo] = []
    for tname, meta in header.items():
        if tname == "__metadata__":
            continue
        if not isinstance(meta, dict):
            raise ValueError(f"tensor {tname!r}: entry is not an object")
        start, end = meta["data_offsets"]
        if not (0 <= start <= end) or 8 + n + end > size:
            raise ValueError(f"tensor {tname!r}: data_offsets {start}..{end} outside the file")
        shape = tuple(int(d) for d in meta["shape"])
        out.append(TensorInfo(tname, str(meta["dtype"]), shape, int(end - start)))
    return tuple(out)


def read_folder_tensors(folder: Path) -> tuple[TensorInfo, ...]:
    """All tensors of a folder's ``*.safetensors`` files (headers only)."""
    tensors: list[TensorInfo] = []
    for f in sorted(folder.glob("*.safetensors")):
        try:
            tensors.extend(read_safetensors_header(f))
        except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise UsageError(
                f"{f}: not a readable safetensors file ({exc})", "re-download the model files"
            ) from exc
    return tuple(tensors)


# --------------------------------------------------------------------------------------------------
# resolving a model name
# --------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _CONFIG_MAX:
            raise UsageError(f"{path}: {path.stat().st_size} bytes is too big for a model config")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror})") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a JSON object")
    return data


def spec_from_folder(
    folder: Path, *, name: str | None = None, hf_id: str | None = None, origin: str = "folder"
) -> ModelSpec:
    """Read a local model folder: config.json, quantization config, safetensors headers."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{folder}: no config.json here", "give a Hugging Face model folder")
    cfg = _read_json(cfg_path)
    quant = quant_from_config(cfg.get("quantization_config"), f"{cfg_path} quantization_config")
    for alt in ("quantize_config.json", "quant_config.json"):
        if quant is None and (folder / alt).is_file():
            quant = quant_from_config(_read_json(folder / alt), str(folder / alt))
    tensors = read_folder_tensors(folder)
    return spec_from_config(
        cfg,
        name=name or str(folder),
        hf_id=hf_id,
        path=str(folder),
        origin=origin,
        where=str(cfg_path),
        quant=quant,
        tensors=tensors,
    )


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it (HF_HUB_CACHE, HF_HOME)."""
    env = os.environ if env is None else env
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"])
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]) / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".cache"
    return base / "huggingface" / "hub"


def hf_cache_snapshot(repo_id: str, env: Mapping[str, str] | None = None) -> Path | None:
    """The snapshot folder of a cached model (refs/main first, else the newest snapshot)."""
    repo = hf_hub_cache(env) / ("models--" + repo_id.replace("/", "--"))
    snaps = repo / "snapshots"
    try:
        if not snaps.is_dir():
            return None
        ref = repo / "refs" / "main"
        if ref.is_file():
            rev = ref.read_text(encoding="utf-8", errors="replace").strip()
            if rev and "/" not in rev and (snaps / rev / "config.json").is_file():
                return snaps / rev
        found = [p for p in snaps.iterdir() if (p / "config.json").is_file()]
        return max(found, key=lambda p: p.stat().st_mtime) if found else None
    except OSError as exc:
        raise UsageError(f"{repo}: cannot read the Hugging Face cache ({exc.strerror})") from exc


def _profile_dir() -> Path:
    from tuner.data import data_dir

    return data_dir("playbooks") / "models"


@functools.cache
def load_profiles() -> dict[str, ModelSpec]:
    """All built-in profiles, ``playbooks/models/*.toml``, keyed by profile name."""
    from tuner.data import load_toml

    out: dict[str, ModelSpec] = {}
    for path in sorted(_profile_dir().glob("*.toml")):
        out[path.stem] = spec_from_profile(path.stem, load_toml(path), str(path))
    return out


def spec_from_profile(name: str, data: Mapping[str, Any], where: str) -> ModelSpec:
    """A profile TOML: [model] hf_id/description, [config] numbers, [sources], [quantization]."""
    model = data.get("model") or {}
    cfg = dict(data.get("config") or {})
    qd = data.get("quantization")
    quant = None
    if qd:
        quant = QuantSpec(
            method=str(qd["method"]),
            bits=qd.get("bits"),
            group_size=qd.get("group_size"),
            desc_act=qd.get("desc_act"),
            sym=qd.get("sym"),
            zero_point=qd.get("zero_point"),
            modules_in_16bit=tuple(qd.get("modules_in_16bit", ())),
            source=str(qd.get("source", where)),
        )
    sources = {str(k): str(v) for k, v in (data.get("sources") or {}).items()}
    default_src = sources.pop("config", where)
    for key in _ARCH_FIELDS:
        sources.setdefault(key, default_src)
    return spec_from_config(
        cfg,
        name=name,
        hf_id=str(model.get("hf_id")) if model.get("hf_id") else None,
        path=None,
        origin="profile",
        where=where,
        quant=quant,
        sources=sources,
        description=str(model.get("description", "")),
    )


def resolve_model(name: str, env: Mapping[str, str] | None = None) -> ModelSpec:
    """A profile name, a local folder, or a model id in the local HF cache (in that order)."""
    if not name:
        raise UsageError("no model given", f"use --model with one of: {', '.join(sorted(load_profiles()))}")
    profiles = load_profiles()
    if name in profiles:
        return profiles[name]
    p = Path(name).expanduser()
    if p.is_dir():
        return spec_from_folder(p)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        snap = hf_cache_snapshot(name, env)
        if snap is not None:
            return spec_from_folder(snap, name=name, hf_id=name, origin="hf-cache")
        for prof in profiles.values():  # a profile's repo id is as good as its name
            if prof.hf_id == name:
                return prof
    raise UsageError(
        f"unknown model {name!r}: not a built-in profile, not a folder, not in the Hugging Face cache"
        f" ({hf_hub_cache(env)})",
        f"built-in profiles: {', '.join(sorted(profiles))}",
    )


# --------------------------------------------------------------------------------------------------
# memory arithmetic
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WeightEstimate:
    """Bytes of the weights as vLLM holds them, and how they were counted."""

    total_bytes: int  # whole model, all GPUs together
    linear_params: int  # parameters in the decoder's linear layers (the quantizable ones)
    other_params: int  # embeddings, lm_head, norms, biases (kept 16-bit)
    method: str  # "safetensors headers (exact)" | "shapes x scheme"
    scheme: str  # "bf16" | "gptq int4 g128" | "fp8 (load-time)" ...

    def per_gpu(self, tp: int) -> int:
        return -(-self.total_bytes // max(1, tp))


def linear_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(in_features, out_features) of every decoder linear layer, from config.json's numbers."""
    h, inter = spec.hidden_size, spec.intermediate_size
    q_out = spec.num_attention_heads * spec.head_dim
    kv_out = spec.num_key_value_heads * spec.head_dim
    per_layer = [(h, q_out), (h, kv_out), (h, kv_out), (q_out, h), (h, inter), (h, inter), (inter, h)]
    return per_layer * spec.num_hidden_layers


def other_params(spec: ModelSpec) -> int:
    """Embeddings, lm_head (unless tied), RMSNorm weights and attention biases."""
    h = spec.hidden_size
    n = spec.vocab_size * h * (1 if spec.tie_word_embeddings else 2)
    n += spec.num_hidden_layers * 2 * h + h
    if spec.attention_bias:
        n += (
            spec.num_hidden_layers * (spec.num_attention_heads + 2 * spec.num_key_value_heads) * spec.head_dim
        )
    return n


def quantized_linear_bytes(k: int, n: int, quant: QuantSpec | None, act_dtype_bytes: int = 2) -> int:
    """Stored bytes of one linear layer (in_features k, out_features n) under a scheme.

    GPTQ (AutoGPTQ layout, as vLLM's gptq/gptq_marlin load it): qweight int32 [k/8*bits/4.., n]
    = k*n*bits/8 bytes, qzeros int32 [k/g, n*bits/32], scales fp16 [k/g, n], g_idx int32 [k]
    when desc_act. AWQ (GEMM layout): qweight [k, n*bits/32] int32, qzeros [k/g, n*bits/32],
    scales [k/g, n]. FP8: one byte per weight plus a per-tensor fp32 scale.
    """
    if quant is None:
        return k * n * act_dtype_bytes
    method = quant.method.lower()
    bits = quant.bits or 4
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "compressed-tensors") and bits in (2, 3, 4, 8):
        g = quant.group_size if quant.group_size and quant.group_size > 0 else k
        groups = -(-k // g)
        qweight = k * n * bits // 8
        qzeros = groups * n * bits // 8
        scales = groups * n * 2
        g_idx = 4 * k if (method.startswith("gptq") and quant.desc_act) else 0
        return qweight + qzeros + scales + g_idx
    if method in ("fp8", "fbgemm_fp8", "modelopt") or bits == 8:
        return k * n + 4
    return k * n * act_dtype_bytes


def _is_linear_tensor(t: TensorInfo) -> bool:
    return len(t.shape) == 2 and ".layers." in t.name and t.name.endswith("proj.weight")


def weight_estimate(spec: ModelSpec, load_quantization: str | None = None) -> WeightEstimate:
    """Bytes of the weights vLLM holds with these arguments: after load-time quantization, before offload.

    ``load_quantization`` is a ``--quantization`` that converts a 16-bit checkpoint at load
    (``fp8``: vLLM's Fp8LinearMethod stores each linear weight as float8_e4m3fn, one byte per
    weight, with a per-tensor scale; embeddings, lm_head and norms stay 16-bit).
    """
    convert_fp8 = load_quantization == "fp8" and (spec.quant is None)
    act = 2  # vLLM serves fp32 checkpoints in 16-bit by default ("auto" dtype)
    linear = sum(k * n for k, n in linear_shapes(spec))
    other = other_params(spec)
    if spec.tensors:
        if not convert_fp8:
            return WeightEstimate(
                spec.checkpoint_bytes or 0, linear, other, "safetensors headers (exact)", _scheme(spec)
            )
        total = 0
        for t in spec.tensors:
            numel = 1
            for d in t.shape:
                numel *= d
            total += (numel + 4) if _is_linear_tensor(t) else t.nbytes
        return WeightEstimate(total, linear, other, "safetensors headers + fp8 load-time conversion", "fp8")
    if convert_fp8:
        q: QuantSpec | None = QuantSpec("fp8", bits=8)
    else:
        q = spec.quant
    lin_bytes = sum(quantized_linear_bytes(k, n, q, act) for k, n in linear_shapes(spec))
    total = lin_bytes + other * act
    return WeightEstimate(
        total,
        linear,
        other,
        "shapes from config.json x quantization scheme",
        "fp8 (load-time)" if convert_fp8 else _scheme(spec),
    )


def _scheme(spec: ModelSpec) -> str:
    q = spec.quant
    if q is None:
        return spec.torch_dtype
    g = f" g{q.group_size}" if q.group_size and q.group_size > 0 else ""
    return f"{q.method} int{q.bits}{g}" if q.bits and q.bits < 8 else f"{q.method}"


def kv_bytes_per_token(spec: ModelSpec, kv_dtype_bytes: int = 2, tp: int = 1) -> int:
    """KV cache bytes one token occupies on one GPU.

    Standard/GQA attention: 2 (K and V) x layers x kv_heads x head_dim x bytes, with the KV
    heads split over tensor-parallel ranks (replicated when there are fewer heads than ranks).
    MLA (DeepSeek-V2/V3): one latent of kv_lora_rank + qk_rope_head_dim values per layer,
    not split by TP (vllm/model_executor/layers/attention MLA spec: head_size = kv_lora_rank +
    qk_rope_head_dim, num_kv_heads = 1).
    """
    layers = spec.num_hidden_layers
    if spec.is_mla:
        return layers * ((spec.kv_lora_rank or 0) + (spec.qk_rope_head_dim or 0)) * kv_dtype_bytes
    heads = max(1, spec.num_key_value_heads // max(1, tp))
    return 2 * layers * heads * spec.head_dim * kv_dtype_bytes


CPU_BLOCK_SIZE = 128  # vllm/platforms/cpu.py check_and_update_config (0.32): block_size = 128 unless set
GPU_BLOCK_SIZE = 16  # vllm/config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE (0.32)


def kv_capacity_tokens(
    available_bytes: int, bytes_per_token: int, block_size: int, max_model_len: int | None = None
) -> int:
    """The "KV cache size: N tokens" vLLM logs for a given KV memory.

    vllm/v1/core/kv_cache_utils.py (0.32): ``num_blocks = available_memory // bytes_per_block``
    (get_kv_cache_config_from_groups); the logged capacity is
    ``int(num_blocks / cdiv(max_model_len, block_size) * max_model_len)``
    (get_kv_cache_capacity, get_max_concurrency_for_kv_cache_config) -- num_blocks x block_size
    whenever max_model_len is a multiple of the block size.
    """
    if available_bytes <= 0 or bytes_per_token <= 0:
        return 0
    num_blocks = available_bytes // (bytes_per_token * block_size)
    if max_model_len is None or max_model_len % block_size == 0:
        return num_blocks * block_size
    per_req = -(-max_model_len // block_size)
    return int(num_blocks / per_req * max_model_len)


def max_len_that_fits(available_bytes: int, bytes_per_token: int, block_size: int, limit: int) -> int:
    """The longest max_model_len whose one request fits, as vLLM's admission check computes it.

    vllm/v1/core/kv_cache_utils.py (0.32) get_kv_cache_configs: one block is held back for the
    null block (``check_memory = available - bytes_per_block``), then a request of length L
    needs ``cdiv(L, block_size)`` blocks; estimate_max_model_len binary-searches the largest L.
    """
    per_block = bytes_per_token * block_size
    usable_blocks = (available_bytes - per_block) // per_block if per_block > 0 else 0
    return max(0, min(limit, usable_blocks * block_size))


def expected_cpu_kv_tokens(model_spec: ModelSpec, space_gib: int, max_model_len: int | None = None) -> int:
    """KV capacity vLLM's CPU backend reports ("CPU KV cache size: N tokens") for VLLM_CPU_KVCACHE_SPACE.

    vllm/platforms/cpu.py (0.32): ``kv_cache_memory_bytes = VLLM_CPU_KVCACHE_SPACE * GiB``;
    vllm/v1/worker/cpu_worker.py determine_available_memory returns it unchanged; blocks of
    128 tokens; model dtype KV (bf16 = 2 bytes). Checked against a real start of
    tests/tinymodel.py's Llama: 1 GiB -> 2,097,152 tokens (tests/calibration/cpu-tiny-llama.log).
    """
    return kv_capacity_tokens(
        int(space_gib) * (1 << 30),
        kv_bytes_per_token(model_spec, model_spec.dtype_bytes if model_spec.dtype_bytes <= 2 else 2),
        CPU_BLOCK_SIZE,
        max_model_len,
    )

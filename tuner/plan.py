"""The memory plan: weights, KV cache and overheads for the card at hand, and vLLM's arguments.

Every argument carries its reason.

GPU target -- vLLM's own start-up accounting (vllm/v1/worker/gpu_worker.py
``determine_available_memory``, vllm/v1/worker/utils.py ``request_memory``,
vllm/utils/mem_utils.py ``memory_profiling``; read in vLLM 0.32.0)::

    requested = ceil(total_memory x gpu_memory_utilization)     # must be <= free memory at start
    kv_cache  = requested - weights - non_torch - activation_peak - cuda_graphs
    tokens    = kv_cache // (block_size x bytes_per_token) x block_size   # "GPU KV cache size: N tokens"

CPU target (no GPU: laptops, CI) -- vLLM's CPU backend sizes its KV cache from
``VLLM_CPU_KVCACHE_SPACE`` GiB exactly (vllm/platforms/cpu.py, vllm/v1/worker/cpu_worker.py)
in blocks of 128 tokens.

The constants that are not exact (non-torch memory, activation peak, CUDA graphs) are
models with their sources named in :data:`OVERHEAD_SOURCES`; ``tests/calibration/``
holds real start-up logs users pasted in public issues, and ``tests/test_plan_calibration.py``
reports how far this plan's ``kv_cache_tokens`` lands from what vLLM logged.

Values the user sets (vLLM arguments after ``--``, ``VLLM_CPU_KVCACHE_SPACE``) win: the plan
computes with them, warns when vLLM will refuse them, and never rewrites them.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tuner.errors import BadAnswer, ExitCode, UsageError
from tuner.host import Host
from tuner.models import (
    CPU_BLOCK_SIZE,
    GPU_BLOCK_SIZE,
    ModelSpec,
    WeightEstimate,
    kv_bytes_per_token,
    kv_capacity_tokens,
    load_profiles,
    max_len_that_fits,
    resolve_model,
    weight_estimate,
)
from tuner.probes.net import is_loopback
from tuner.vllm_cli import ASSUMED_VERSION, VllmHelp

GiB = 1 << 30
MiB = 1 << 20

# -- overhead models (each with where it comes from) -------------------------------------------------
CUDA_CONTEXT_BYTES = 512 * MiB
"""Memory the CUDA context and allocator hold before vLLM's first memory snapshot. It is not part of
``requested`` (vllm/v1/worker/gpu_worker.py takes init_snapshot after device init), but it must be free
at start, so utilization x total may not exceed free - this."""
NON_TORCH_TP1 = int(0.14 * GiB)
NON_TORCH_TPN = int(0.55 * GiB)
ACT_WORKSPACE = 0  # no fixed term: the two parts above reproduce the logs without one
LOGITS_COPIES = 3  # fp32 logits, probabilities and log-probabilities of the sampler's dummy run
GRAPH_BASE = 256 * MiB
GRAPH_PER_LAYER = 8 * MiB
UTIL_DEFAULT = 0.90
UTIL_SQUEEZE = 0.95
UTIL_CEILING = 0.97  # graph capture failed at 0.98 and passed at 0.97 on a 24 GB card (DOMAIN.md)
MIN_CONTEXT = 2048  # below this a 70B model is not worth serving: plan offload instead
SQUEEZE_TARGET = 8192  # what the 48 GB tier serves (DOMAIN.md sizing tiers): squeeze until it fits
OFFLOAD_CONTEXT = 4096  # the 24 GB tier: int4 70B with offload, <= 4K context
MAX_PLANNED_LEN = 32768
HOST_RAM_MARGIN = 4 * GiB  # left to the OS, vLLM's own process and the page cache when offloading
CPU_RAM_MARGIN = 2 * GiB
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}  # GB/s after encoding
ASSUMED_PCIE = (4, 16)

OVERHEAD_SOURCES = {
    "budget": "vllm/v1/worker/utils.py request_memory (vLLM 0.32.0): ceil(total x gpu_memory_utilization);"
    " start fails when free memory is below it",
    "weights": "safetensors headers when the files are here, else config.json shapes x the quantization"
    " scheme (tuner/models.py weight_estimate)",
    "non_torch": "CUDA/NCCL memory outside PyTorch: ~0.14 GiB at TP=1, ~0.55 GiB at TP>=2, measured on"
    " H100 by llm-d's capacity planner (llm-d/llm-d-benchmark config_explorer capacity_planner.py)",
    "activation_peak": "peak of vLLM's profile_run with max_num_batched_tokens tokens: tokens x (3 x"
    " intermediate + 3 x hidden) x 2 bytes for the MLP/residual tensors, plus max_num_seqs x vocab x 4"
    " bytes x 3 for the sampler's logits; reproduces vLLM's logged 1.26 GiB"
    " for Llama-3-8B at 8192 tokens (vllm-project/vllm#10511) and 0.57 GiB at 2048 tokens"
    " (vllm-project/vllm#57047)",
    "cuda_graphs": "CUDA graph pool, profiled and subtracted by default since vLLM 0.21"
    " (gpu_worker.py profile_cudagraph_memory, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): modelled as"
    " 256 MiB + 8 MiB per layer; 0 with --enforce-eager",
    "kv_cache": "vllm/v1/core/kv_cache_utils.py (0.32.0): num_blocks = kv_bytes // (block_size x bytes"
    " per token); capacity = num_blocks x block_size",
    "cpu_kv": "vllm/platforms/cpu.py (0.32.0): kv_cache_memory_bytes = VLLM_CPU_KVCACHE_SPACE x GiB;"
    " vllm/v1/worker/cpu_worker.py determine_available_memory returns it; block_size 128",
}


# --------------------------------------------------------------------------------------------------
# request and result
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanRequest:
    model: str
    gpu_mem: str | None = None
    gpus: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key_set: bool = False
    allow_unauthenticated: bool = False
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # the environment launch will give vLLM


@dataclass(frozen=True)
class MemoryTerm:
    name: str
    bytes: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bytes": self.bytes,
            "gib": round(self.bytes / GiB, 3),
            "source": self.source,
        }


@dataclass(frozen=True)
class Plan:
    feasible: bool
    reason: str
    target: str  # "gpu" | "cpu"
    model_name: str
    model_path: str  # what is passed to vLLM's --model
    vllm_args: tuple[str, ...]  # after the module: --model, --host, --port, the user's extras; no API key
    env: dict[str, str]  # variables to set for vLLM (VLLM_CPU_KVCACHE_SPACE ...)
    reasons: dict[str, str]  # argument -> why
    warnings: tuple[str, ...]
    numa_node: int | None
    numa_reason: str
    weights_bytes: int  # as vLLM holds them (after load-time quantization, before offload), all GPUs
    kv_bytes_per_token: int  # per GPU, for the chosen KV dtype
    kv_cache_tokens: int  # what vLLM will log at start ("GPU/CPU KV cache size: N tokens")
    max_model_len: int
    vllm_version: str | None
    vllm_version_assumed: bool
    vllm_dist: str | None = None
    vllm_help_source: str = ""
    vllm_flags_checked: bool = False  # the arguments were checked against the installed vLLM's --help
    kv_cache_bytes: int = 0  # per GPU
    kv_cache_dtype: str = "auto"
    max_len_fits: int = 0  # the longest --max-model-len the KV cache admits
    concurrency: float = 0.0  # kv_cache_tokens / max_model_len
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    memory: tuple[MemoryTerm, ...] = ()  # the budget and each term, per GPU
    weights_method: str = ""
    weights_scheme: str = ""
    device: dict[str, Any] = field(default_factory=dict)  # what was planned for (GPU name, sizes, source)
    offload_bytes: int = 0  # --cpu-offload-gb in bytes (per GPU)
    offload_tokens_per_s_ceiling: float | None = None  # PCIe bandwidth / offloaded bytes
    pcie_bandwidth_bytes_s: float | None = None
    pcie_source: str = ""
    host_ram_available: int | None = None
    model: dict[str, Any] = field(default_factory=dict)
    squeeze: tuple[str, ...] = ()  # what the plan shrank to fit, in order
    nearest_plan: Plan | None = None
    api_key_in_extras: str | None = field(default=None, repr=False, compare=False)  # never serialized

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "target": self.target,
            "model_name": self.model_name,
            "model_path": self.model_path,
            "vllm_args": list(self.vllm_args),
            "env": dict(self.env),
            "reasons": dict(self.reasons),
            "warnings": list(self.warnings),
            "numa_node": self.numa_node,
            "numa_reason": self.numa_reason,
            "weights_bytes": self.weights_bytes,
            "weights_method": self.weights_method,
            "weights_scheme": self.weights_scheme,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_model_len": self.max_model_len,
            "max_len_fits": self.max_len_fits,
            "concurrency": round(self.concurrency, 2),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
            "memory": [t.to_dict() for t in self.memory],
            "device": dict(self.device),
            "offload_bytes": self.offload_bytes,
            "offload_tokens_per_s_ceiling": (
                round(self.offload_tokens_per_s_ceiling, 2) if self.offload_tokens_per_s_ceiling else None
            ),
            "pcie_bandwidth_bytes_s": self.pcie_bandwidth_bytes_s,
            "pcie_source": self.pcie_source,
            "host_ram_available": self.host_ram_available,
            "squeeze": list(self.squeeze),
            "vllm_version": self.vllm_version,
            "vllm_version_assumed": self.vllm_version_assumed,
            "vllm_dist": self.vllm_dist,
            "vllm_help_source": self.vllm_help_source,
            "vllm_flags_checked": self.vllm_flags_checked,
            "model": dict(self.model),
            "nearest_plan": self.nearest_plan.to_dict() if self.nearest_plan else None,
        }


# --------------------------------------------------------------------------------------------------
# small parsers
# --------------------------------------------------------------------------------------------------
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'24GiB' -> 24 x 2^30, '48GB' -> 48 x 10^9, '80G' -> 80 x 2^30 (a bare G means GiB)."""
    m = _SIZE.match(text or "")
    if not m:
        raise UsageError(f"cannot read the size {text!r}", "write it like 24GiB, 48GB or 80G")
    value, unit = float(m.group(1)), (m.group(2) or "GiB").lower()
    power = "bkmgt".index(unit[0])
    base = 1000 if unit.endswith("b") and not unit.endswith("ib") and unit != "b" else 1024
    n = int(value * base**power)
    if n <= 0:
        raise UsageError(f"the size {text!r} is not positive")
    return n


ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-q": "--quantization"}
BOOLEAN_FLAGS = {
    "--enforce-eager",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
    "--trust-remote-code",
    "--disable-log-requests",
    "--disable-log-stats",
}


@dataclass(frozen=True)
class UserArg:
    flag: str  # canonical long form ("--max-model-len"); "--no-x" kept as written
    value: str | None
    tokens: tuple[str, ...]  # exactly as the user typed them


def parse_extra_args(extra: Sequence[str], help_: VllmHelp | None = None) -> list[UserArg]:
    """The vLLM arguments after ``--``: ``--flag value``, ``--flag=value``, ``--flag``, ``--no-flag``."""
    out: list[UserArg] = []
    i = 0
    items = list(extra)
    while i < len(items):
        tok = items[i]
        if not tok.startswith("-") or tok == "-":
            out.append(UserArg("", tok, (tok,)))  # a positional (vLLM takes the model as one)
            i += 1
            continue
        if "=" in tok and tok.startswith("--"):
            name, value = tok.split("=", 1)
            out.append(UserArg(ALIASES.get(name, name), value, (tok,)))
            i += 1
            continue
        name = ALIASES.get(tok, tok)
        takes = help_.takes_value(name) if help_ is not None else None
        if takes is None:
            takes = name not in BOOLEAN_FLAGS and not name.startswith("--no-")
            if takes and (i + 1 >= len(items) or (items[i + 1].startswith("--"))):
                takes = False
        if takes and i + 1 < len(items):
            out.append(UserArg(name, items[i + 1], (tok, items[i + 1])))
            i += 2
        else:
            out.append(UserArg(name, None, (tok,)))
            i += 1
    return out


def _base_flag(flag: str) -> str:
    return "--" + flag[5:] if flag.startswith("--no-") else flag


def human_readable_int(value: str) -> int:
    """vLLM's own reading of sizes such as --kv-cache-memory-bytes (vllm/utils/argparse_utils.py, 0.32):
    lower-case k/m/g/t are powers of 1000, upper-case K/M/G/T powers of 1024."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
    if not m:
        return int(value.strip())
    number, suffix = m.groups()
    mult = {
        "k": 10**3,
        "m": 10**6,
        "g": 10**9,
        "t": 10**12,
        "K": 1 << 10,
        "M": 1 << 20,
        "G": 1 << 30,
        "T": 1 << 40,
    }
    return int(float(number) * mult[suffix])


# Flags vLLM reads with human_readable_int ("16k" = 16000, "8K" = 8192; vllm/engine/arg_utils.py, 0.32);
# --max-model-len also takes "auto" or -1 (vLLM chooses), which the plan treats as not given.
HUMAN_INT_FLAGS = frozenset(
    {
        "--max-model-len",
        "--max-num-batched-tokens",
        "--max-num-scheduled-tokens",
        "--max-num-queued-tokens",
        "--kv-cache-memory-bytes",
        "--kv-cache-memory",  # argparse takes this abbreviation of --kv-cache-memory-bytes
    }
)


def _user_number(uval: Mapping[str, str | None], flag: str, warnings: list[str]) -> float | None:
    """The number the user gave after ``--`` for ``flag``, read as vLLM reads it; None when not given,
    and a warning when vLLM would refuse it."""
    v = uval.get(flag)
    if v is None or v == "__no__":
        return None
    try:
        if flag not in HUMAN_INT_FLAGS:
            return float(v)
        if flag == "--max-model-len" and v.strip().lower() in ("auto", "-1"):
            return None
        return float(human_readable_int(v))
    except ValueError:
        warnings.append(f"{flag} {v!r} is not a number; vLLM will refuse it")
        return None


def _int_arg(uval: Mapping[str, str | None], flag: str, warnings: list[str]) -> int | None:
    f = _user_number(uval, flag, warnings)
    return int(f) if f is not None else None


def _user_kv_memory(uval: Mapping[str, str | None], warnings: list[str]) -> int | None:
    flag = (
        "--kv-cache-memory-bytes" if uval.get("--kv-cache-memory-bytes") is not None else "--kv-cache-memory"
    )
    return _int_arg(uval, flag, warnings)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


# --------------------------------------------------------------------------------------------------
# facts the plan needs from the host
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """The GPU(s) planned for: one card's memory (the smallest of those used) and its link."""

    name: str
    count: int
    total: int  # bytes per GPU (nvmlDeviceGetMemoryInfo.total, or --gpu-mem)
    free: int  # bytes per GPU free now (other processes' memory counted), = total for --gpu-mem
    compute_capability: tuple[int, int] | None
    pcie_gen: int | None
    pcie_width: int | None
    numa_node: int | None
    source: str  # "nvml" | "nvidia-smi.xml" | "--gpu-mem"
    other_processes: tuple[str, ...] = ()
    pci_bus_ids: tuple[str, ...] = ()  # sysfs spelling ("0000:81:00.0") of the GPUs planned for


@dataclass(frozen=True)
class HostFacts:
    devices: Device | None  # None: no GPU -> CPU target
    gpu_reason: str  # why there is no GPU target
    mem_available: int | None  # /proc/meminfo MemAvailable
    numa_node: int | None  # node with the most free memory (CPU target)
    numa_free: int | None
    numa_reason: str
    vllm: VllmHelp
    # The node a GPU launch binds to (tuner/probes/numa.py launch_node) and why; an empty reason means
    # "not looked up" (hand-built facts): the plan then takes the Device's own numa_node.
    gpu_numa_node: int | None = None
    gpu_numa_reason: str = ""


def gather_facts(req: PlanRequest, host: Host, vllm: VllmHelp | None = None) -> HostFacts:
    """Read what the plan needs: GPUs (NVML / snapshot XML), host memory, NUMA nodes, vLLM's flags."""
    from tuner.probes import Facts
    from tuner.probes.memory import read_meminfo
    from tuner.vllm_cli import vllm_help

    probes = Facts(host)
    meminfo, _ = read_meminfo(host)
    mem_available = meminfo.get("MemAvailable", meminfo.get("MemFree"))
    numa = _numa_facts(probes)
    node, node_free, numa_reason = cpu_numa(numa)
    device: Device | None = None
    gpu_reason = ""
    if req.gpu_mem:
        total = parse_size(req.gpu_mem)
        device = Device(
            f"a {req.gpu_mem} card", max(1, req.gpus or 1), total, total, None, None, None, None, "--gpu-mem"
        )
    else:
        device, gpu_reason = _live_devices(probes, req.gpus)
    gpu_node, gpu_node_reason = gpu_numa(numa, device)
    if vllm is None:
        vllm = vllm_help(host if host.live else None)
    return HostFacts(
        device, gpu_reason, mem_available, node, node_free, numa_reason, vllm, gpu_node, gpu_node_reason
    )


def _numa_facts(probes: Any) -> Any:
    """tuner/probes/numa.py's facts (nodes from /sys/devices/system/node, each GPU's node from NVML or
    /sys/bus/pci/devices/<id>/numa_node); None when the probe breaks (the plan then launches unbound)."""
    try:
        return probes.get("numa")
    except Exception:  # the NUMA probe is another module; a broken sysfs must not break the plan
        return None


def cpu_numa(numa: Any) -> tuple[int | None, int | None, str]:
    """CPU target: the node with the most free memory (vLLM's CPU backend keeps weights and KV cache in
    host RAM, so the node's free memory is what it can use)."""
    from tuner.probes.numa import node_with_most_free_memory

    nodes = tuple(numa.nodes) if numa is not None else ()
    if not nodes:
        why = (numa.nodes_reason if numa is not None else "") or "the NUMA probe failed"
        return None, None, f"no NUMA nodes reported ({why})"
    node = node_with_most_free_memory(numa)
    if node is None:
        return None, None, "no node reports its available memory"
    free = next(n.available for n in nodes if n.id == node)
    if len(nodes) == 1:
        return node, free, f"node {node} is this host's only NUMA node ({_gib(free or 0)} available)"
    return (
        node,
        free,
        (
            f"CPU backend: node {node} has the most memory available ({_gib(free or 0)}) of"
            f" {len(nodes)} nodes; weights and KV cache live in host RAM"
        ),
    )


def gpu_numa(numa: Any, dev: Device | None) -> tuple[int | None, str]:
    """GPU target: the node of the GPU (tuner/probes/numa.py launch_node): NVML's NUMA node id, else the
    PCI device's /sys/bus/pci/devices/<id>/numa_node; on a multi-node host where no GPU reports one, the
    node with the most free memory; None on a one-node host, where binding changes nothing."""
    from tuner.probes.numa import launch_node, node_with_most_free_memory

    if dev is None:
        return None, ""
    if numa is None or not numa.nodes:
        why = (numa.nodes_reason if numa is not None else "") or "the NUMA probe failed"
        return None, f"no NUMA nodes reported ({why}); launch unbound"
    if not numa.multi_node:
        return None, "one NUMA node with CPUs on this host: binding changes nothing; launch unbound"
    wanted = [b.lower() for b in dev.pci_bus_ids] or None
    node = launch_node(numa, wanted)
    if node is None:
        return None, "no GPU reports its NUMA node and no node its free memory; launch unbound"
    for g in numa.gpus:
        if (wanted is None or g.pci_bus_id in wanted) and g.node == node:
            where = (
                "NVML nvmlDeviceGetNumaNodeId"
                if g.node_source == "nvml"
                else (f"/sys/bus/pci/devices/{g.pci_bus_id}/numa_node")
            )
            note = " (--gpu-mem: this host's GPU)" if dev.source == "--gpu-mem" else ""
            gpu = f"GPU {g.pci_bus_id}" + (f" ({g.name})" if g.name else "")
            return node, f"{gpu} is on NUMA node {node} ({where}){note}"
    if node == node_with_most_free_memory(numa):
        free = next((n.available for n in numa.nodes if n.id == node), None)
        return node, (
            f"no GPU reports its NUMA node; node {node} has the most memory available ({_gib(free or 0)})"
            f" of {len(numa.nodes)} nodes"
        )
    return node, f"node {node}"


def _live_devices(probes: Any, want: int | None) -> tuple[Device | None, str]:
    from tuner.host import State

    try:
        inv = probes.get("gpu")  # tuner/probes/gpu.py: tuner.gpu.read_gpus with process names
    except Exception as exc:  # the GPU adapter is another module; a broken driver must not break the plan
        return None, f"GPU inventory failed: {exc}"
    if inv.state is not State.OK or not inv.gpus:
        return None, inv.reason or "no NVIDIA GPU here"
    gpus = list(inv.gpus)[: max(1, want or 1)]
    if want and want > len(inv.gpus):
        return None, f"--gpus {want} asked, {len(inv.gpus)} GPU(s) here"
    small = min(gpus, key=lambda g: g.memory_free)
    pcie = small.pcie
    others = tuple(
        f"pid {p.pid} {p.name or '?'} {_gib(p.used_bytes) if p.used_bytes is not None else '?'}"
        for g in gpus
        for p in g.processes
    )
    return Device(
        name=small.name,
        count=len(gpus),
        total=min(g.memory_total for g in gpus),
        free=min(g.memory_free for g in gpus),
        compute_capability=small.compute_capability,
        pcie_gen=pcie.gen_max if pcie else None,
        pcie_width=pcie.width_max if pcie else None,
        numa_node=small.numa_node,
        source=inv.source or "nvml",
        other_processes=others,
        pci_bus_ids=tuple(str(g.pci_bus_id).lower() for g in gpus),
    ), ""


# --------------------------------------------------------------------------------------------------
# the arithmetic
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogitsProfile:
    """The logits vLLM's profile run materialises: rows x vocab x bytes x copies."""

    rows: str  # "seqs": one row per request (max_num_seqs); "batched": every batched token
    bytes_per_value: int
    copies: int
    source: str


SAMPLER_LOGITS = LogitsProfile(
    "seqs",
    4,
    LOGITS_COPIES,
    "the sampler's dummy run: max_num_seqs rows of fp32 logits, probabilities and log-probabilities"
    " (vllm/v1/worker/gpu_model_runner.py _dummy_sampler_run; vllm/worker/model_runner.py profile_run in V0)",
)
V1_07_LOGITS = LogitsProfile(
    "batched",
    2,
    1,
    "vLLM 0.7.x V1 engine (VLLM_USE_V1=1): vllm/v1/worker/gpu_model_runner.py profile_run computes"
    " logits for all max_num_batched_tokens rows in the model dtype and runs no sampler ('TODO(woosuk):"
    " Consider the memory usage of the sampler'); one row per request and a dummy sampler run came"
    " with vllm-project/vllm#13594 (0.8)",
)


def logits_profile(version: str | None, env: Mapping[str, str]) -> LogitsProfile:
    """Which logits the start-up profile of this vLLM version holds at its peak."""
    v = _version_tuple(version)
    if v and (0, 7, 0) <= v < (0, 8, 0) and env.get("VLLM_USE_V1", "").strip() == "1":
        return V1_07_LOGITS
    return SAMPLER_LOGITS


def activation_peak_bytes(
    spec: ModelSpec,
    batched_tokens: int,
    max_seqs: int,
    tp: int = 1,
    logits: LogitsProfile = SAMPLER_LOGITS,
) -> int:
    """vLLM's profile_run peak beyond the weights (see OVERHEAD_SOURCES["activation_peak"])."""
    per_token = (3 * spec.intermediate_size // max(1, tp) + 3 * spec.hidden_size) * 2
    # the MLP is split across TP ranks; the logits are gathered whole on the first rank
    rows = batched_tokens if logits.rows == "batched" else max_seqs
    logits_bytes = rows * spec.vocab_size * logits.bytes_per_value * logits.copies
    return batched_tokens * per_token + logits_bytes + ACT_WORKSPACE


def cuda_graph_bytes(spec: ModelSpec, eager: bool) -> int:
    return 0 if eager else GRAPH_BASE + GRAPH_PER_LAYER * spec.num_hidden_layers


def _version_tuple(version: str | None) -> tuple[int, ...]:
    parts = re.findall(r"\d+", (version or "").split("+")[0])[:3]
    return tuple(int(p) for p in parts)


def cuda_graphs_counted(version: str | None, env: Mapping[str, str]) -> tuple[bool, str]:
    """Whether vLLM subtracts its CUDA graph pool from the KV budget: yes since 0.21, unless
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 (vllm/envs.py, gpu_worker.py determine_available_memory)."""
    if env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "").strip() == "0":
        return False, "not subtracted: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0"
    v = _version_tuple(version)
    if v and v < (0, 21):
        return False, f"not subtracted: vLLM {version} captures graphs after sizing the KV cache"
    return True, f"subtracted by vLLM {version or ASSUMED_VERSION}"


def non_torch_bytes(tp: int) -> int:
    return NON_TORCH_TP1 if tp <= 1 else NON_TORCH_TPN


def pcie_bandwidth(dev: Device | None) -> tuple[float, str]:
    """Bytes/s of the GPU's link at its maximum (the link idles at a lower gen to save power)."""
    if dev is not None and dev.pcie_gen and dev.pcie_width:
        bw = PCIE_GBPS_PER_LANE.get(dev.pcie_gen, 1.969) * dev.pcie_width * 1e9
        return bw, f"PCIe Gen{dev.pcie_gen} x{dev.pcie_width} ({dev.source} max link)"
    gen, width = ASSUMED_PCIE
    return PCIE_GBPS_PER_LANE[gen] * width * 1e9, f"assumed PCIe Gen{gen} x{width} (no link measured)"


@dataclass
class _Knobs:
    util: float
    kv_dtype: str
    batched: int
    seqs: int
    eager: bool
    offload_gib: float
    max_len: int | None  # the user's; None = the plan chooses
    kv_memory: int | None = None  # the user's --kv-cache-memory-bytes


def _kv_dtype_bytes(kv_dtype: str, spec: ModelSpec) -> int:
    if kv_dtype.startswith("fp8") or kv_dtype.startswith("int8"):
        return 1
    if kv_dtype in ("float32",):
        return 4
    return 2 if spec.dtype_bytes >= 2 else spec.dtype_bytes


@dataclass(frozen=True)
class _GpuMath:
    budget: int
    weights_pg: int
    non_torch: int
    activation: int
    graphs: int
    kv_bytes: int
    kvpt: int
    tokens: int
    fits: int


def _gpu_math(
    spec: ModelSpec,
    w: WeightEstimate,
    dev: Device,
    tp: int,
    k: _Knobs,
    block: int,
    graphs_counted: bool = True,
    logits: LogitsProfile = SAMPLER_LOGITS,
) -> _GpuMath:
    budget = math.ceil(dev.total * k.util)
    weights_pg = max(0, w.per_gpu(tp) - int(k.offload_gib * GiB))
    nt = non_torch_bytes(tp)
    act = activation_peak_bytes(spec, k.batched, k.seqs, tp, logits)
    graphs = cuda_graph_bytes(spec, k.eager) if graphs_counted else 0
    kv = budget - weights_pg - nt - act - graphs
    if k.kv_memory is not None:  # --kv-cache-memory-bytes: vLLM skips profiling and uses it as given
        kv = k.kv_memory
    kvpt = kv_bytes_per_token(spec, _kv_dtype_bytes(k.kv_dtype, spec), tp)
    tokens = kv_capacity_tokens(kv, kvpt, block, k.max_len)
    fits = max_len_that_fits(kv, kvpt, block, 1 << 30) if kv > 0 else 0
    return _GpuMath(budget, weights_pg, nt, act, graphs, kv, kvpt, tokens, fits)


# --------------------------------------------------------------------------------------------------
# building the plan
# --------------------------------------------------------------------------------------------------
def build_plan(req: PlanRequest, host: Host | None = None) -> Plan:
    """Plan a vLLM start for ``req`` on ``host`` (None = this machine)."""
    host = host or Host.live_host()
    spec = resolve_model(req.model, req.env or None)
    facts = gather_facts(req, host)
    return compute_plan(req, spec, facts)


def compute_plan(req: PlanRequest, spec: ModelSpec, facts: HostFacts) -> Plan:
    """The pure part: no reads, only arithmetic over the spec and the facts (bench/plan.py times this)."""
    user = parse_extra_args(req.extra_args, facts.vllm if facts.vllm.known else None)
    uval: dict[str, str | None] = {}
    for a in user:
        if a.flag:
            uval[_base_flag(a.flag)] = a.value if not a.flag.startswith("--no-") else "__no__"
    warnings: list[str] = []
    api_key_extra = None
    if "--api-key" in uval:
        api_key_extra = uval.pop("--api-key")
        user = [a for a in user if a.flag != "--api-key"]
        warnings.append(
            "--api-key after -- was taken off the command line (other users can read it there);"
            " it reaches vLLM as VLLM_API_KEY"
        )
    bind_host = uval.get("--host") or req.host
    api_key_set = req.api_key_set or bool(api_key_extra) or bool(req.env.get("VLLM_API_KEY"))
    if spec.sliding_window:
        warnings.append(
            f"{spec.name} uses sliding-window attention ({spec.sliding_window} tokens): vLLM's hybrid KV"
            " cache manager keeps only the window for those layers, so it may report more tokens than"
            " this plan, which counts full attention (the conservative side)"
        )
    if facts.devices is not None:
        plan = _plan_gpu(req, spec, facts, user, uval, warnings)
    else:
        plan = _plan_cpu(req, spec, facts, user, uval, warnings)
    if not is_loopback(bind_host) and not api_key_set and not req.allow_unauthenticated:
        plan = replace(
            plan,
            feasible=False,
            reason=f"--host {bind_host} exposes the API beyond this machine without an API key: set --api-key"
            " (or VLLM_API_KEY), bind 127.0.0.1, or say --allow-unauthenticated",
        )
    return replace(plan, api_key_in_extras=api_key_extra)


def _sm(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}{cc[1]}" if cc else "?"


def _quant_arg(spec: ModelSpec, dev: Device | None) -> tuple[str | None, str]:
    q = spec.quant
    if q is None:
        return None, ""
    cc = dev.compute_capability if dev else None
    marlin_ok = cc is None or cc >= (8, 0)
    m = q.method.lower()
    if m in ("gptq", "awq"):  # int4 checkpoints: both have a Marlin kernel on sm80+
        if marlin_ok:
            return f"{m}_marlin", (
                f"checkpoint is {m.upper()} int{q.bits} g{q.group_size}; the Marlin kernel (sm80+) is"
                " vLLM's fast path for it" + ("" if cc else ", assuming an Ampere or newer card")
            )
        return m, f"checkpoint is {m.upper()} int{q.bits}; Marlin needs sm80+, this card is sm{_sm(cc)}"
    if m == "fp8":
        slow = cc is not None and cc < (8, 9)
        return "fp8", (
            "checkpoint is FP8 (per-tensor)"
            + (
                "; this card has no FP8 units (sm89+), vLLM falls back to weight-only FP8 Marlin (slower)"
                if slow
                else "; Ada/Hopper run it on FP8 tensor cores"
            )
        )
    return q.method, f"checkpoint's quantization_config says {q.method}"


def _dtype_arg(spec: ModelSpec, dev: Device | None, target: str) -> tuple[str, str]:
    if spec.quant and spec.quant.method.lower() in ("gptq", "awq"):
        return "float16", "int4 GPTQ/AWQ kernels compute in float16 (vLLM's awq refuses bfloat16)"
    if target == "cpu":
        return "bfloat16", "the CPU backend runs bfloat16 (float16 is slow or unsupported on CPUs)"
    cc = dev.compute_capability if dev else None
    if cc is not None and cc < (8, 0):
        return "float16", f"sm{cc[0]}{cc[1]} has no bfloat16; float16 instead"
    if spec.torch_dtype in ("bfloat16", "float32", "float"):
        return "bfloat16", f"the checkpoint is {spec.torch_dtype}; bfloat16 keeps its range at 2 bytes"
    return "float16", f"the checkpoint is {spec.torch_dtype}"


def _plan_gpu(
    req: PlanRequest,
    spec: ModelSpec,
    facts: HostFacts,
    user: list[UserArg],
    uval: dict[str, str | None],
    warnings: list[str],
    with_nearest: bool = True,
) -> Plan:
    dev = facts.devices
    assert dev is not None
    tp = _int_arg(uval, "--tensor-parallel-size", warnings) or dev.count
    if tp > dev.count and dev.source != "--gpu-mem":
        warnings.append(f"--tensor-parallel-size {tp} needs {tp} GPUs; {dev.count} planned here")
    block = _int_arg(uval, "--block-size", warnings) or GPU_BLOCK_SIZE
    quant_arg, quant_why = _quant_arg(spec, dev)
    user_quant = uval.get("--quantization")
    load_q = user_quant if user_quant else quant_arg
    w = weight_estimate(spec, load_q if spec.quant is None else None)
    big = dev.total >= 70 * GiB
    # The utilization the card allows: vLLM refuses to start when free < utilization x total, and the
    # CUDA context must fit beside the budget.
    util_cap = max(
        0.0, min(UTIL_CEILING, math.floor((dev.free - CUDA_CONTEXT_BYTES) / dev.total * 100) / 100)
    )
    user_util = _user_number(uval, "--gpu-memory-utilization", warnings)
    user_len = _int_arg(uval, "--max-model-len", warnings)
    user_kv = uval.get("--kv-cache-dtype")
    user_seqs = _int_arg(uval, "--max-num-seqs", warnings)
    user_batched = _int_arg(uval, "--max-num-batched-tokens", warnings)
    user_eager = uval.get("--enforce-eager")
    user_offload = _user_number(uval, "--cpu-offload-gb", warnings)
    k = _Knobs(
        util=user_util if user_util is not None else min(UTIL_DEFAULT, util_cap),
        kv_dtype=user_kv or "auto",
        batched=user_batched or (8192 if big else 2048),
        seqs=user_seqs or (256 if big else 64),
        eager=user_eager is not None and user_eager != "__no__",
        offload_gib=user_offload or 0.0,
        max_len=user_len,
        kv_memory=_user_kv_memory(uval, warnings),
    )
    squeeze: list[str] = []
    graphs_counted, graphs_why = cuda_graphs_counted(facts.vllm.version, req.env)
    logits = logits_profile(facts.vllm.version, req.env)
    target = min(spec.max_position_embeddings, SQUEEZE_TARGET)
    m = _gpu_math(spec, w, dev, tp, k, block, graphs_counted, logits)

    def need_more() -> bool:
        return _gpu_math(spec, w, dev, tp, k, block, graphs_counted, logits).fits < target

    # Shrink what can shrink, in the order that costs least, before reaching for offload.
    if need_more() and user_util is None and util_cap > k.util:
        k.util = min(UTIL_SQUEEZE, util_cap)
        squeeze.append(f"--gpu-memory-utilization {k.util:.2f} (the card allows {util_cap:.2f})")
    if need_more() and (user_batched is None or user_seqs is None):
        if user_batched is None and k.batched > 1024:
            k.batched = 1024
        if user_seqs is None and k.seqs > 16:
            k.seqs = 16
        squeeze.append(
            f"--max-num-batched-tokens {k.batched} --max-num-seqs {k.seqs} (smaller activation peak)"
        )
    if need_more() and user_kv is None:
        k.kv_dtype = "fp8"
        squeeze.append("--kv-cache-dtype fp8 (half the KV bytes per token)")
    if need_more() and user_eager is None:
        k.eager = True
        squeeze.append("--enforce-eager (no CUDA graph pool)")
    m = _gpu_math(spec, w, dev, tp, k, block, graphs_counted, logits)
    offload_needed = m.fits < min(spec.max_position_embeddings, MIN_CONTEXT)
    if offload_needed and user_offload is None:
        # Offload just enough weights that OFFLOAD_CONTEXT tokens fit, in whole GiB.
        want_len = min(spec.max_position_embeddings, OFFLOAD_CONTEXT)
        need = (want_len + 2 * block) * m.kvpt - m.kv_bytes
        k.offload_gib = float(max(1, math.ceil(need / GiB)))
        squeeze.append(
            f"--cpu-offload-gb {k.offload_gib:g} (weights do not fit beside a {want_len}-token KV cache)"
        )
        m = _gpu_math(spec, w, dev, tp, k, block, graphs_counted, logits)
    # the 24 GB tier serves <= 4K with offload
    len_cap = OFFLOAD_CONTEXT if k.offload_gib else MAX_PLANNED_LEN
    max_len = user_len if user_len is not None else min(spec.max_position_embeddings, len_cap, m.fits)
    if user_len is None and max_len >= 4096:
        max_len -= max_len % 256
    k.max_len = max_len
    m = _gpu_math(spec, w, dev, tp, k, block, graphs_counted, logits)
    tokens = m.tokens
    concurrency = tokens / max_len if max_len > 0 else 0.0

    # Feasibility.
    feasible, reason = True, ""
    ram = facts.mem_available
    offload_total = int(k.offload_gib * GiB) * tp
    if offload_total and ram is not None and offload_total > ram - HOST_RAM_MARGIN:
        feasible = False
        reason = (
            f"{spec.name} needs --cpu-offload-gb {k.offload_gib:g} per GPU on {_gib(dev.total)},"
            " but this host"
            f" has {_gib(ram)} of RAM available ({_gib(HOST_RAM_MARGIN)} kept for the system)"
        )
    elif m.weights_pg + m.non_torch + m.activation + m.graphs > m.budget and user_offload is not None:
        feasible = False
        reason = (
            f"the weights ({_gib(m.weights_pg)} per GPU) and overheads do not fit the budget {_gib(m.budget)}"
        )
    elif m.fits <= 0 or m.kv_bytes <= 0:
        feasible = False
        reason = f"no memory is left for the KV cache ({_gib(m.kv_bytes)}) after weights and overheads"
    if user_len is not None and user_len > m.fits:
        warnings.append(
            f"--max-model-len {user_len} exceeds what the KV cache holds ({m.fits} tokens);"
            " vLLM will refuse to start"
        )
    if user_len is not None and user_len > spec.max_position_embeddings:
        warnings.append(
            f"--max-model-len {user_len} is above the model's max_position_embeddings"
            f" ({spec.max_position_embeddings}); vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    if user_util is not None and math.ceil(dev.total * user_util) > dev.free:
        warnings.append(
            f"--gpu-memory-utilization {user_util:g} asks {_gib(dev.total * user_util)} but only"
            f" {_gib(dev.free)} is free; vLLM will refuse to start"
        )
    if dev.other_processes:
        warnings.append("other processes hold GPU memory: " + "; ".join(dev.other_processes))
    if util_cap < UTIL_DEFAULT and user_util is None:
        warnings.append(
            f"only {_gib(dev.free)} of {_gib(dev.total)} is free; utilization capped at {util_cap:.2f}"
        )

    bw, bw_src = pcie_bandwidth(dev if dev.source != "--gpu-mem" else None)
    offload_bytes = int(k.offload_gib * GiB)
    ceiling = bw / offload_bytes if offload_bytes else None
    if offload_bytes:
        warnings.append(
            f"--cpu-offload-gb {k.offload_gib:g}: every decode step streams {_gib(offload_bytes)} over"
            f" {bw_src}: at most {ceiling:.1f} tokens/s per sequence"
        )

    # Arguments, each with its reason.
    args: list[tuple[str, str | None, str]] = [
        ("--model", _model_path(spec), f"{spec.origin} {spec.name}"),
    ]
    if quant_arg and not user_quant:
        args.append(("--quantization", quant_arg, quant_why))
    dtype, dtype_why = _dtype_arg(spec, dev, "gpu")
    args.append(("--dtype", dtype, dtype_why))
    if tp > 1:
        args.append(("--tensor-parallel-size", str(tp), f"{tp} GPUs: weights and KV heads split {tp} ways"))
    args.append(
        (
            "--gpu-memory-utilization",
            f"{k.util:.2f}",
            f"{_gib(m.budget)} of {_gib(dev.total)} per GPU; the card allows up to {util_cap:.2f} with"
            f" {_gib(dev.free)} free" + (" (squeezed up)" if k.util > UTIL_DEFAULT else ""),
        )
    )
    args.append(
        (
            "--max-model-len",
            str(max_len),
            f"the KV cache ({tokens} tokens) holds {concurrency:.1f} requests of this length;"
            " the model allows"
            f" {spec.max_position_embeddings}",
        )
    )
    args.append(
        (
            "--kv-cache-dtype",
            k.kv_dtype,
            f"{m.kvpt} bytes/token/GPU"
            + (
                " (fp8 halves the KV cache to fit)"
                if k.kv_dtype == "fp8"
                else " in the model's dtype (best quality)"
            ),
        )
    )
    args.append(
        (
            "--max-num-seqs",
            str(k.seqs),
            f"sampler logits of {k.seqs} sequences x {spec.vocab_size} vocab are part of the activation peak",
        )
    )
    args.append(
        (
            "--max-num-batched-tokens",
            str(k.batched),
            f"prefill chunk size; the activation peak ({_gib(m.activation)}) scales with it",
        )
    )
    if k.eager:
        args.append(
            ("--enforce-eager", None, "no memory for the CUDA graph pool: eager decode is slower but fits")
        )
    if k.offload_gib:
        args.append(
            (
                "--cpu-offload-gb",
                f"{k.offload_gib:g}",
                f"{_gib(offload_bytes)} of weights per GPU stay in host RAM: <= {ceiling or 0:.1f} tok/s",
            )
        )
    args.append(("--enable-prefix-caching", None, "requests sharing a prompt prefix reuse its KV blocks"))
    memory = (
        MemoryTerm("budget", m.budget, OVERHEAD_SOURCES["budget"]),
        MemoryTerm(
            "weights",
            m.weights_pg,
            f"{w.method} ({w.scheme}); {_gib(w.total_bytes)} in all"
            + (f", {_gib(offload_bytes)} offloaded" if offload_bytes else ""),
        ),
        MemoryTerm("non_torch", m.non_torch, OVERHEAD_SOURCES["non_torch"]),
        MemoryTerm(
            "activation_peak",
            m.activation,
            OVERHEAD_SOURCES["activation_peak"]
            + ("" if logits is SAMPLER_LOGITS else f"; here: {logits.source}"),
        ),
        MemoryTerm("cuda_graphs", m.graphs, OVERHEAD_SOURCES["cuda_graphs"] + f"; {graphs_why}"),
        MemoryTerm("kv_cache", max(0, m.kv_bytes), OVERHEAD_SOURCES["kv_cache"]),
    )
    device = {
        "name": dev.name,
        "count": dev.count,
        "total_bytes": dev.total,
        "free_bytes": dev.free,
        "compute_capability": list(dev.compute_capability) if dev.compute_capability else None,
        "source": dev.source,
        "other_processes": list(dev.other_processes),
    }
    if not feasible and not reason:
        reason = "does not fit"
    plan = _assemble(
        req,
        spec,
        facts,
        "gpu",
        args,
        user,
        uval,
        warnings,
        feasible,
        reason or _ok_reason(spec, dev, tokens, max_len),
        numa_node=facts.gpu_numa_node if facts.gpu_numa_reason else dev.numa_node,
        numa_reason=facts.gpu_numa_reason
        or (
            f"GPU's NUMA node {dev.numa_node} ({dev.source})"
            if dev.numa_node is not None
            else "the GPU's NUMA node is not reported (single-node host or VM); launch unbound"
        ),
        weights=w,
        kvpt=m.kvpt,
        tokens=tokens,
        max_len=max_len,
        fits=m.fits,
        kv_bytes=max(0, m.kv_bytes),
        kv_dtype=k.kv_dtype,
        util=k.util,
        tp=tp,
        memory=memory,
        device=device,
        offload_bytes=offload_bytes,
        ceiling=ceiling,
        bw=bw,
        bw_src=bw_src,
        squeeze=tuple(squeeze),
        env={},
    )
    if not plan.feasible and with_nearest:
        plan = replace(plan, nearest_plan=_nearest(req, spec, facts))
    return plan


def _ok_reason(spec: ModelSpec, dev: Device, tokens: int, max_len: int) -> str:
    return (
        f"{spec.name} fits {dev.count} x {dev.name} ({_gib(dev.total)}): {tokens} KV tokens,"
        f" {tokens / max_len if max_len else 0:.1f} requests of {max_len} tokens"
    )


CARD_SIZES_GIB = (16, 24, 32, 40, 48, 80, 96, 141)


def _nearest(req: PlanRequest, spec: ModelSpec, facts: HostFacts) -> Plan | None:
    """The smallest common card (one GPU) on which this model plans feasibly without offload, else with it."""
    if req.gpu_mem and facts.devices and facts.devices.source == "--gpu-mem":
        start = facts.devices.total
    else:
        start = 0
    for size in CARD_SIZES_GIB:
        if size * GiB <= start:
            continue
        alt_req = replace(req, gpu_mem=f"{size}GiB", gpus=1, extra_args=())
        dev = Device(f"a {size}GiB card", 1, size * GiB, size * GiB, None, None, None, None, "--gpu-mem")
        alt = _plan_gpu(alt_req, spec, replace(facts, devices=dev), [], {}, [], with_nearest=False)
        if alt.feasible and not alt.offload_bytes:
            return replace(alt, reason=f"nearest plan that works: one {size} GiB card. " + alt.reason)
    return None


def _model_path(spec: ModelSpec) -> str:
    return spec.path or spec.hf_id or spec.name


def _plan_cpu(
    req: PlanRequest,
    spec: ModelSpec,
    facts: HostFacts,
    user: list[UserArg],
    uval: dict[str, str | None],
    warnings: list[str],
) -> Plan:
    w = weight_estimate(spec, None)
    kvpt = kv_bytes_per_token(spec, 2, 1)
    block = _int_arg(uval, "--block-size", warnings) or CPU_BLOCK_SIZE
    user_len = _int_arg(uval, "--max-model-len", warnings)
    free = facts.numa_free if facts.numa_free is not None else facts.mem_available
    room = (free or 0) - w.total_bytes - CPU_RAM_MARGIN
    space_env = req.env.get("VLLM_CPU_KVCACHE_SPACE")
    env: dict[str, str] = {}
    feasible, reason = True, ""
    space_reason = ""
    user_bytes = _user_kv_memory(uval, warnings)
    space_bytes: int | None = None
    if user_bytes is not None and space_env in (None, ""):
        # vllm/platforms/cpu.py: VLLM_CPU_KVCACHE_SPACE, when set, replaces --kv-cache-memory-bytes;
        # unset, the user's bytes are the KV cache.
        space_bytes = user_bytes
        space_gib = max(1, user_bytes // GiB)
        space_reason = f"set by you (--kv-cache-memory-bytes {user_bytes})"
    elif space_env not in (None, ""):
        try:
            space_gib = int(str(space_env))
        except ValueError:
            space_gib = 0
            warnings.append(
                f"VLLM_CPU_KVCACHE_SPACE={space_env!r} is not a whole number of GiB; vLLM will fail"
            )
        space_reason = f"set by you (VLLM_CPU_KVCACHE_SPACE={space_env})"
        if space_gib * GiB > room > 0:
            warnings.append(
                f"VLLM_CPU_KVCACHE_SPACE={space_env} GiB is more than the {_gib(room)} left beside the"
                " weights; vLLM refuses when the node's available memory is below it"
            )
    else:
        want_len = min(spec.max_position_embeddings, MAX_PLANNED_LEN)
        need = kvpt * want_len * 8  # room for 8 requests of the planned length
        space_gib = max(1, min(math.ceil(need / GiB), int(room // GiB)))
        space_reason = (
            f"{space_gib} GiB of host RAM for the KV cache: 8 requests of {want_len} tokens need"
            f" {_gib(need)}, {_gib(max(0, room))} is left beside the weights"
        )
        env["VLLM_CPU_KVCACHE_SPACE"] = str(space_gib)
    if room < GiB and space_env in (None, "") and user_bytes is None:
        where = f"NUMA node {facts.numa_node}" if facts.numa_node is not None else "this host"
        feasible = False
        reason = (
            f"{spec.name} ({_gib(w.total_bytes)} of weights) leaves {_gib(max(0, room))} of RAM for the KV"
            f" cache on {where};"
            " vLLM's CPU backend needs at least 1 GiB"
        )
    if user_bytes is not None and space_env not in (None, ""):
        warnings.append("VLLM_CPU_KVCACHE_SPACE replaces --kv-cache-memory-bytes on vLLM's CPU backend")
    space = space_bytes if space_bytes is not None else space_gib * GiB
    fits = max_len_that_fits(space, kvpt, block, 1 << 30)
    max_len = user_len if user_len is not None else min(spec.max_position_embeddings, MAX_PLANNED_LEN, fits)
    tokens = kv_capacity_tokens(space, kvpt, block, max_len)
    if user_len is not None and user_len > fits:
        warnings.append(
            f"--max-model-len {user_len} exceeds what the KV cache holds ({fits} tokens);"
            " vLLM will refuse to start"
        )
    if feasible and fits < min(spec.max_position_embeddings, MIN_CONTEXT):
        warnings.append(f"the KV cache holds only {fits} tokens")
    args: list[tuple[str, str | None, str]] = [("--model", _model_path(spec), f"{spec.origin} {spec.name}")]
    dtype, dtype_why = _dtype_arg(spec, None, "cpu")
    args.append(("--dtype", dtype, dtype_why))
    args.append(
        (
            "--max-model-len",
            str(max_len),
            f"the KV cache ({tokens} tokens in {space_gib} GiB) holds"
            f" {tokens / max_len if max_len else 0:.1f}"
            f" requests of this length; the model allows {spec.max_position_embeddings}",
        )
    )
    memory = (
        MemoryTerm("weights", w.total_bytes, f"{w.method} ({w.scheme}), in host RAM"),
        MemoryTerm("kv_cache", space, OVERHEAD_SOURCES["cpu_kv"]),
    )
    device = {
        "name": "CPU (vLLM CPU backend)",
        "count": 1,
        "free_bytes": free,
        "source": "meminfo",
        "why_cpu": facts.gpu_reason or "no GPU",
    }
    ok = (
        f"{spec.name} on vLLM's CPU backend: {tokens} KV tokens in VLLM_CPU_KVCACHE_SPACE={space_gib} GiB"
        f" ({facts.gpu_reason or 'no GPU here'})"
    )
    plan = _assemble(
        req,
        spec,
        facts,
        "cpu",
        args,
        user,
        uval,
        warnings,
        feasible,
        reason or ok,
        numa_node=facts.numa_node,
        numa_reason=facts.numa_reason,
        weights=w,
        kvpt=kvpt,
        tokens=tokens,
        max_len=max_len,
        fits=fits,
        kv_bytes=space,
        kv_dtype="auto",
        util=None,
        tp=1,
        memory=memory,
        device=device,
        offload_bytes=0,
        ceiling=None,
        bw=None,
        bw_src="",
        squeeze=(),
        env=env,
    )
    plan = replace(plan, reasons={**plan.reasons, "VLLM_CPU_KVCACHE_SPACE": space_reason})
    if not plan.feasible:
        plan = replace(plan, nearest_plan=_nearest(req, spec, facts))
    return plan


def _assemble(
    req: PlanRequest,
    spec: ModelSpec,
    facts: HostFacts,
    target: str,
    args: list[tuple[str, str | None, str]],
    user: list[UserArg],
    uval: Mapping[str, str | None],
    warnings: list[str],
    feasible: bool,
    reason: str,
    *,
    numa_node: int | None,
    numa_reason: str,
    weights: WeightEstimate,
    kvpt: int,
    tokens: int,
    max_len: int,
    fits: int,
    kv_bytes: int,
    kv_dtype: str,
    util: float | None,
    tp: int,
    memory: tuple[MemoryTerm, ...],
    device: dict[str, Any],
    offload_bytes: int,
    ceiling: float | None,
    bw: float | None,
    bw_src: str,
    squeeze: tuple[str, ...],
    env: dict[str, str],
) -> Plan:
    help_ = facts.vllm
    args = [
        *args,
        (
            "--host",
            req.host,
            "loopback only: nothing outside this machine reaches the API"
            if is_loopback(req.host)
            else "reachable from the network" + (" (API key required)" if req.api_key_set else ""),
        ),
        ("--port", str(req.port), "the OpenAI-compatible API port"),
    ]
    reasons: dict[str, str] = {}
    if req.api_key_set or req.env.get("VLLM_API_KEY"):
        reasons["VLLM_API_KEY"] = "the API key reaches vLLM through its environment, never the command line"
    out: list[str] = []
    for flag, value, why in args:
        if flag in uval:
            reasons[flag] = (
                f"set by you ({_user_text(user, flag)}); the plan would say {value or 'it'}: {why}"
            )
            continue
        spelled = help_.spelling(flag)
        if spelled is None:
            warnings.append(f"vLLM {help_.version} has no {flag}; left out ({why})")
            continue
        choices = help_.choices(spelled)
        if value is not None and choices and value not in choices:
            warnings.append(
                f"vLLM {help_.version} does not accept {flag} {value} (choices: {', '.join(choices)});"
                " left out"
            )
            continue
        out.append(spelled)
        if value is not None:
            out.append(value)
        reasons[spelled] = why
    for a in user:
        if a.flag and help_.known and not help_.accepts(a.flag):
            warnings.append(f"vLLM {help_.version} does not know {a.flag}; it will refuse to start")
        elif a.flag and a.value is not None and (ch := help_.choices(a.flag)) and a.value not in ch:
            warnings.append(
                f"vLLM {help_.version} does not accept {a.flag} {a.value} (choices: {', '.join(ch)})"
            )
        if a.flag == "--model" or (not a.flag):
            warnings.append(
                f"{' '.join(a.tokens)}: you override the model vLLM loads; the plan's numbers are for"
                f" {spec.name}"
            )
        out.extend(a.tokens)
    if target == "cpu" and "VLLM_CPU_KVCACHE_SPACE" in req.env:
        pass
    elif target == "gpu" and req.env.get("VLLM_CPU_KVCACHE_SPACE"):
        warnings.append("VLLM_CPU_KVCACHE_SPACE is set but the target is a GPU; vLLM's GPU build ignores it")
    return Plan(
        feasible=feasible,
        reason=reason,
        target=target,
        model_name=spec.name,
        model_path=_model_path(spec),
        vllm_args=tuple(out),
        env=env,
        reasons=reasons,
        warnings=tuple(dict.fromkeys(warnings)),
        numa_node=numa_node,
        numa_reason=numa_reason,
        weights_bytes=weights.total_bytes,
        kv_bytes_per_token=kvpt,
        kv_cache_tokens=tokens,
        max_model_len=max_len,
        vllm_version=help_.version or ASSUMED_VERSION,
        vllm_version_assumed=help_.version is None,
        vllm_dist=help_.dist,
        vllm_help_source=help_.source,
        vllm_flags_checked=help_.known,
        kv_cache_bytes=kv_bytes,
        kv_cache_dtype=kv_dtype,
        max_len_fits=fits,
        concurrency=tokens / max_len if max_len else 0.0,
        gpu_memory_utilization=util,
        tensor_parallel_size=tp,
        memory=memory,
        weights_method=weights.method,
        weights_scheme=weights.scheme,
        device=device,
        offload_bytes=offload_bytes,
        offload_tokens_per_s_ceiling=ceiling,
        pcie_bandwidth_bytes_s=bw,
        pcie_source=bw_src,
        host_ram_available=facts.mem_available,
        model=spec.to_dict(),
        squeeze=squeeze,
    )


def _user_text(user: list[UserArg], flag: str) -> str:
    for a in user:
        if a.flag and _base_flag(a.flag) == flag:
            return " ".join(a.tokens)
    return flag


# --------------------------------------------------------------------------------------------------
# rendering and the command
# --------------------------------------------------------------------------------------------------
def _vllm_line(plan: Plan) -> str:
    """Which vLLM the plan was made for, and where its flags came from."""
    if plan.vllm_version_assumed:
        return (
            f"vLLM: {plan.vllm_version} assumed: vLLM is not installed here, so the arguments were not"
            " checked against its --help"
        )
    name = f"vLLM: {plan.vllm_dist or 'vllm'} {plan.vllm_version}"
    if plan.vllm_flags_checked:
        return f"{name}; flags checked against {plan.vllm_help_source}"
    return f"{name}; flags not checked ({plan.vllm_help_source or 'its --help was not read'})"


def render_text(plan: Plan) -> str:
    """Plain text for pipes and logs: every number and the reason for each argument."""
    lines = [
        f"plan: {'FEASIBLE' if plan.feasible else 'REFUSED'} -- {plan.reason}",
        f"target: {plan.target} ({plan.device.get('name', '?')}, {plan.device.get('source', '')})",
        f"model: {plan.model_name} -> --model {plan.model_path}",
        _vllm_line(plan),
        f"weights: {plan.weights_bytes} bytes ({_gib(plan.weights_bytes)}; {plan.weights_method};"
        f" {plan.weights_scheme})",
        f"kv bytes/token: {plan.kv_bytes_per_token} ({plan.kv_cache_dtype})",
        f"kv cache: {plan.kv_cache_tokens} tokens ({_gib(plan.kv_cache_bytes)}); longest request that fits:"
        f" {plan.max_len_fits}",
        f"max model len: {plan.max_model_len}; concurrency at that length: {plan.concurrency:.2f}",
    ]
    if plan.memory:
        lines.append("memory (per GPU):" if plan.target == "gpu" else "memory:")
        for t in plan.memory:
            lines.append(f"  {t.name:16} {t.bytes / GiB:9.2f} GiB  {t.source}")
    if plan.offload_bytes:
        lines.append(
            f"offload: {_gib(plan.offload_bytes)} over {plan.pcie_source}: <="
            f" {plan.offload_tokens_per_s_ceiling or 0:.2f} tokens/s"
        )
    if plan.squeeze:
        lines.append("squeezed: " + "; ".join(plan.squeeze))
    lines.append(f"numa: {plan.numa_node if plan.numa_node is not None else '-'} ({plan.numa_reason})")
    if plan.env:
        lines.append("env: " + " ".join(f"{k}={v}" for k, v in plan.env.items()))
    lines.append("arguments:")
    for flag, why in plan.reasons.items():
        lines.append(f"  {flag:28} {why}")
    lines.append("command: python -m vllm.entrypoints.openai.api_server " + " ".join(plan.vllm_args))
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    if plan.nearest_plan is not None:
        lines.append(f"nearest plan: {plan.nearest_plan.reason}")
        lines.append(
            "  command: python -m vllm.entrypoints.openai.api_server " + " ".join(plan.nearest_plan.vllm_args)
        )
    return "\n".join(lines) + "\n"


def render_rich(plan: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    style = "green" if plan.feasible else "red"
    console.print(
        f"[bold {style}]{'FEASIBLE' if plan.feasible else 'REFUSED'}[/] {plan.reason}", highlight=False
    )
    nums = Table(title="memory plan", show_header=True, header_style="bold")
    nums.add_column("quantity")
    nums.add_column("value", justify="right")
    nums.add_column("source / note")
    nums.add_row("target", plan.target, f"{plan.device.get('name', '?')} ({plan.device.get('source', '')})")
    nums.add_row(
        "vLLM",
        f"{plan.vllm_version}",
        (
            "assumed (vLLM not installed here; arguments not checked)"
            if plan.vllm_version_assumed
            else ("flags from " if plan.vllm_flags_checked else "flags not checked: ") + plan.vllm_help_source
        ),
    )
    nums.add_row(
        "weights_bytes", f"{plan.weights_bytes:,}", f"{_gib(plan.weights_bytes)}; {plan.weights_method}"
    )
    nums.add_row("kv_bytes_per_token", f"{plan.kv_bytes_per_token:,}", plan.kv_cache_dtype)
    nums.add_row("kv_cache_tokens", f"{plan.kv_cache_tokens:,}", _gib(plan.kv_cache_bytes))
    nums.add_row("max_model_len", f"{plan.max_model_len:,}", f"fits up to {plan.max_len_fits:,}")
    nums.add_row("concurrency", f"{plan.concurrency:.2f}", "requests of max_model_len at once")
    for t in plan.memory:
        short = t.source if len(t.source) <= 60 else t.source[:59] + "…"
        nums.add_row(f"  {t.name}", f"{t.bytes / GiB:.2f} GiB", short)
    if plan.offload_bytes:
        nums.add_row(
            "offload ceiling", f"{plan.offload_tokens_per_s_ceiling or 0:.2f} tok/s", plan.pcie_source
        )
    nums.add_row("numa node", str(plan.numa_node) if plan.numa_node is not None else "-", plan.numa_reason)
    console.print(nums)
    console.print('(full sources of each term: gputune plan --format json, "memory")', style="dim")
    args = Table(title="vLLM arguments", show_header=True, header_style="bold")
    args.add_column("argument")
    args.add_column("why")
    for flag, why in plan.reasons.items():
        args.add_row(flag, why)
    console.print(args)
    if plan.env:
        console.print("env: " + " ".join(f"{k}={v}" for k, v in plan.env.items()), highlight=False)
    console.print(
        "command: python -m vllm.entrypoints.openai.api_server " + " ".join(plan.vllm_args),
        highlight=False,
        soft_wrap=True,
    )
    for w in plan.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    if plan.nearest_plan is not None:
        console.print(f"nearest plan: {plan.nearest_plan.reason}", highlight=False)


def check_options(model: str, gpus: int | None, port: int, gpu_mem: str | None = None) -> None:
    """The checks `plan` and `launch` share on their common options; UsageError when one is wrong."""
    if not model:
        raise UsageError("--model is required", "built-in profiles: " + ", ".join(sorted(load_profiles())))
    if gpu_mem is not None:
        parse_size(gpu_mem)  # an empty or unreadable size is a usage error, not "no --gpu-mem"
    if gpus is not None and gpus < 1:
        raise UsageError("--gpus must be at least 1")
    if not 0 < port < 65536:
        raise UsageError(f"--port {port} is not a TCP port", "give 1-65535")


def main(
    model: str,
    gpu_mem: str | None,
    gpus: int | None,
    host: str,
    port: int,
    api_key: str | None,
    allow_unauthenticated: bool,
    fmt: str,
    list_models: bool,
    extra_args: list[str],
) -> int:
    """`gputune plan`: exit 0 with a feasible plan, 1 when refused (JSON printed too), 2 on usage."""
    if list_models:
        profiles = load_profiles()
        if fmt == "json":
            print(json.dumps([{"name": n, **p.to_dict()} for n, p in profiles.items()], indent=2))
        else:
            for n, p in profiles.items():
                print(f"{n:18} {p.hf_id or '':45} {p.description}")
        return int(ExitCode.OK)
    check_options(model, gpus, port, gpu_mem)
    req = PlanRequest(
        model=model,
        gpu_mem=gpu_mem,
        gpus=gpus,
        host=host,
        port=port,
        api_key_set=bool(api_key),
        allow_unauthenticated=allow_unauthenticated,
        extra_args=tuple(extra_args),
        env=dict(os.environ),
    )
    plan = build_plan(req)
    if fmt == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    elif sys.stdout.isatty():
        render_rich(plan)
    else:
        sys.stdout.write(render_text(plan))
    return int(ExitCode.OK if plan.feasible else ExitCode.BAD_ANSWER)


__all__ = ["BadAnswer", "Plan", "PlanRequest", "build_plan", "compute_plan", "main"]

"""`gputune triage`: why a vLLM run died, with the evidence and the next arguments to try.

Inputs: a run directory from `gputune launch` (the last ``attempt-N/``, else the directory itself) or
any log file; optionally telemetry, a kernel log and the exit status. The log is streamed once
(tuner/triage_scan.py) against the signatures and stage landmarks in ``playbooks/triage/``; each
signature names the vLLM / PyTorch / NCCL / kernel source of its message. The evidence is then
weighed: a CUDA out-of-memory error means a different thing at each start-up stage, another process
holding GPU memory turns a KV-cache failure into a start-up free-memory problem, a SIGKILL with an
OOM-killer line in the kernel log means host RAM, NVRM Xid codes mean hardware (or a software fault).

Exit codes: 0 a cause was found, 1 the cause is ``unknown``, 2 usage (missing or unreadable input),
3 gputune broke.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import triage_lexicon
from tuner.errors import ExitCode, UsageError
from tuner.triage_inputs import (
    TelemetrySummary,
    exit_from_json,
    killed_by_sigkill,
    locate_run,
    read_gpu_processes,
    read_json,
    read_telemetry,
)
from tuner.triage_scan import STAGES, Hit, Playbook, ScanResult, playbook, scan

UNKNOWN = "unknown"
# Signatures that mean the model (path or Hub id) could not be resolved: their advice is about the path.
HUB_RESOLUTION_SIGNATURES = frozenset(
    {
        "hf.invalid_repo_id",
        "hf.hub_exception",
        "hf.hub_exception_bare",
        "hf.repo_not_found",
        "hf.model_files_unreachable",
        "py.hub_client",
    }
)
MIN_CONFIDENCE = 0.3
# An OOM signature's `cause_after_load` (signatures.toml) wins over the stage map; the run-time OOM
# stays an alternative at this weight.
AFTER_LOAD_RUNTIME_WEIGHT = 0.45
# The values --max-lora-rank accepts (vllm/config/lora.py MaxLoRARanks, 0.7 .. 0.32)
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# A CUDA OOM with no stage landmark before or after it: the label stays "runtime" (the stage map's
# default) but weakly, with the start-up labels as alternatives.
STAGELESS_OOM_WEIGHT = 0.6
# A stage-free OOM whose model is larger per GPU than the whole card: a load OOM.
WEIGHTS_EXCEED_CARD_WEIGHT = 0.8
# The process was killed while loading weights: the log stops at a shard-progress line with no error.
SILENT_LOAD_DEATH_WEIGHT = 0.45
# `vllm serve A --model B` with A != B: B is ignored (weak: a model that loads is no failure by itself).
MODEL_TAG_CONFLICT_WEIGHT = 0.5
STAGELESS_OOM_ALTERNATIVES = (("oom_weights_do_not_fit", 0.45), ("oom_sampler_warmup_or_profile_run", 0.4))
# PyTorch's cache holding less than this (reserved but unallocated) has freed nothing but rounding: no
# forward pass has run yet (each frees its activations into the cache). Measured on the corpus's OOMs
# with a known stage: weight creation 0-51 MiB (11 of 13), forward passes 75 MiB and more but for
# vLLM's profile run right after load (7 and 19 MiB).
NOTHING_FREED_MIB = 64.0
# A CUDA OOM whose message shows ten times the request free is not read as a memory shortage (below
# MIN_CONFIDENCE: unknown unless other evidence speaks).
PLENTY_FREE_WEIGHT = 0.25
# a single request larger than this (1 PiB) is more memory than any GPU or host has: the size itself is
# garbage (an overflowed or never-set length, a size received from a rank whose collective failed), so
# the OOM line is a symptom of that bug and names no memory cause
CORRUPT_REQUEST_MIB = float(2**30)
# what such a line still lends its cause: below MIN_CONFIDENCE, weaker than a request the card could hold
CORRUPT_REQUEST_WEIGHT = 0.125
# The largest weight tensors of the 70B class and common MoEs: Qwen2-72B's embedding is 2.3 GiB,
# Llama-4 Scout's stacked experts 2.5 GiB, Mixtral-8x22B's 3 GiB. A larger request is an activation.
LARGEST_WEIGHT_TENSOR_MIB = 4096.0
# with nothing freed, weights lead and run-time takes their place among the alternatives
STAGELESS_NOTHING_FREED_ALTERNATIVES = (
    ("oom_runtime_under_load", STAGELESS_OOM_ALTERNATIVES[0][1]),
    *STAGELESS_OOM_ALTERNATIVES[1:],
)
EARLY_STAGES = ("unknown", "load", "memory_profiling", "kv_allocation")
# Signatures that only say a process died of SIGKILL (the shell's 'Killed', exit status 137 / -9)
SIGKILL_ONLY_SIGNATURES = frozenset({"shell.killed", "process.exit_137"})
# what a server's own teardown SIGKILL looks like, as evidence (text, line, detail): vLLM's, SGLang's
SELF_SIGKILL_EVIDENCE = (
    (
        "Got fatal signal from worker processes, shutting down",
        None,
        "vllm/v1/engine/core_client.py (0.7 .. 0.8) answers a worker's failure with kill_process_tree("
        "os.getpid()): the 'Killed' / SIGKILL after it is vLLM's own teardown; the worker's error above is "
        "the cause",
    ),
    (
        "a traceback of SGLang's processes before the SIGKILL",
        None,
        "SGLang answers a scheduler's or worker's exception with kill_process_tree, which SIGKILLs its own "
        "launcher (python/sglang/srt/utils.py): the 'Killed' after it is SGLang's own teardown; the "
        "exception above is the cause",
    ),
)
GPU_OOM_CAUSES = (
    "oom_weights_do_not_fit",
    "oom_cudagraph_capture",
    "oom_sampler_warmup_or_profile_run",
    "oom_runtime_under_load",
    "no_kv_cache_memory",
    "kv_cache_too_small_for_max_model_len",
    "startup_free_memory_below_target",
)


# --------------------------------------------------------------------------------------------------
# result model
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evidence:
    """One fact behind a diagnosis: a log line, a telemetry fact, the exit status or a kernel line."""

    kind: str  # log | telemetry | exit | kernel
    text: str
    line: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "line": self.line, "detail": self.detail}


@dataclass(frozen=True)
class RemedyOption:
    """One remedy: what to do, and the argument / environment changes that do it (may be empty)."""

    summary: str
    flag_changes: dict[str, str | None] = field(default_factory=dict)
    env_changes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "flag_changes": dict(self.flag_changes),
            "env_changes": dict(self.env_changes),
        }


@dataclass(frozen=True)
class Remediation:
    """The explanation and the argument changes to apply to the failing command, alternatives ranked.

    ``flag_changes``: flag -> new value; ``""`` adds a bare boolean flag; ``None`` removes the flag.
    """

    summary: str
    flag_changes: dict[str, str | None] = field(default_factory=dict)
    env_changes: dict[str, str] = field(default_factory=dict)
    alternatives: tuple[RemedyOption, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "flag_changes": dict(self.flag_changes),
            "env_changes": dict(self.env_changes),
            "alternatives": [a.to_dict() for a in self.alternatives],
        }


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    confidence: float
    evidence: tuple[Evidence, ...]
    stage: str
    remediation: Remediation
    alternatives: tuple[tuple[str, float], ...]
    fixable_by_args: bool
    title: str = ""
    memory: bool = False
    source: str = ""
    vllm_version: str | None = None
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "cause": self.cause,
            "title": self.title,
            "confidence": round(self.confidence, 2),
            "memory": self.memory,
            "stage": self.stage,
            "fixable_by_args": self.fixable_by_args,
            "evidence": [e.to_dict() for e in self.evidence],
            "remediation": self.remediation.to_dict(),
            "alternatives": [{"cause": c, "confidence": round(p, 2)} for c, p in self.alternatives],
            "vllm_version": self.vllm_version,
            "log": self.log,
        }


# --------------------------------------------------------------------------------------------------
# evidence gathering
# --------------------------------------------------------------------------------------------------
@dataclass
class _Candidate:
    cause: str
    confidence: float
    hits: list[Hit] = field(default_factory=list)
    extra: list[Evidence] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)
    first_line: int = 1 << 62
    stage: str = "unknown"
    sig_ids: set[str] = field(default_factory=set)
    # the lexicon's reading (tuner/triage_lexicon.py) when no signature named a cause
    reading: triage_lexicon.Reading | None = None

    def add_hit(self, hit: Hit, weight: float, stage: str) -> None:
        if hit.signature.id not in self.sig_ids and self.sig_ids:
            self.confidence = min(0.99, max(self.confidence, weight) + 0.02)
        else:
            self.confidence = max(self.confidence, weight)
        self.sig_ids.add(hit.signature.id)
        self.hits.append(hit)
        for k, v in hit.groups.items():
            self.groups.setdefault(k, v)
        if hit.line_no < self.first_line:
            self.first_line = hit.line_no
            self.stage = stage


@dataclass
class _Context:
    """Everything known about the run besides the log's signature hits."""

    scan: ScanResult
    pb: Playbook
    argv: list[str]
    env: dict[str, str]
    exit_code: int | None
    telemetry: TelemetrySummary | None
    other_gpu_mib: float | None  # memory other processes held on the GPU (gpu-processes.csv)
    gpu_total_mib: float | None
    kernel: ScanResult | None
    plan: dict[str, Any] = field(default_factory=dict)  # plan.json of the run (tuner/plan.py Plan.to_dict)

    def arg(self, name: str) -> Any:
        """Current value of a vLLM argument: the command line first, then what vLLM logged."""
        flag = "--" + name.replace("_", "-")
        value: Any = None
        found = False
        for i, tok in enumerate(self.argv):
            norm = tok.split("=", 1)[0].replace("_", "-")
            if norm != flag:
                continue
            found = True
            if "=" in tok:
                value = tok.split("=", 1)[1]
            elif i + 1 < len(self.argv) and not self.argv[i + 1].startswith("--"):
                value = self.argv[i + 1]
            else:
                value = True
        if found:
            return value
        return self.scan.args.get(name)

    def num(self, name: str) -> float | None:
        value = self.arg(name)
        if isinstance(value, bool) or value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    @property
    def is_vllm(self) -> bool:
        """The log is vLLM's: its version line, a frame or path inside a vllm package, its command line or
        engine arguments, or a message only vLLM prints. A world size alone is not enough (torch.distributed
        prints one too), nor are stage landmarks (transformers' and TGI's frames are among them)."""
        s = self.scan
        engine_args = any(name != "world_size" for name in s.args)
        return bool(
            s.vllm_version
            or s.vllm_paths
            or self.argv
            or engine_args
            or any(h.signature.id.startswith("vllm.") for h in s.hits)
        )


_UNITS = {
    "B": 1 / 2**20,
    "KiB": 1 / 1024,
    "KB": 1 / 1024,
    "MiB": 1.0,
    "MB": 1.0,
    "GiB": 1024.0,
    "GB": 1024.0,
    "TiB": 2**20,
    "TB": 2**20,
}


def _mib(text: str) -> float | None:
    """'3.29 GiB' -> MiB."""
    parts = text.replace("bytes", "B").split()
    if len(parts) == 1:
        for unit in sorted(_UNITS, key=len, reverse=True):
            if parts[0].endswith(unit):
                parts = [parts[0][: -len(unit)], unit]
                break
    if len(parts) != 2 or parts[1] not in _UNITS:
        return None
    try:
        return float(parts[0]) * _UNITS[parts[1]]
    except ValueError:
        return None


def _torch_oom_facts(text: str) -> dict[str, float]:
    """Numbers in PyTorch's caching-allocator OOM message (c10/cuda/CUDACachingAllocator.cpp)."""
    import re

    size = r"([\d.]+ ?(?:[KMGT]i?B|B|bytes))"
    facts: dict[str, float] = {}
    pats = {
        # 'capacty': the spelling of PyTorch 2.1's message
        "total": rf"total capaci?ty of {size}|; {size} total capacity",
        "free": rf"of which {size} is free|; {size} free",
        "this_process": rf"this process has {size} memory in use",
        "tried": rf"Tried to allocate {size}",
        "reserved_unallocated": rf"and {size} is reserved by PyTorch but unallocated",
        # torch 1.x .. 2.0: '(GPU 0; T total capacity; A already allocated; F free; R reserved in total by
        # PyTorch)'
        "reserved_total": rf"; {size} reserved in total by PyTorch",
        "allocated_by_torch": rf"Of the allocated memory {size} is allocated by PyTorch",
        "already_allocated": rf"; {size} already allocated",
        # torch.cuda.set_per_process_memory_fraction: 'this process has 7.01 GiB memory in use. 6.99 GiB
        # allowed;' (torch 2.1+), '...; 6.99 GiB allowed; ...' (1.x)
        "allowed": rf"{size} allowed;",
    }
    for key, pat in pats.items():
        m = re.search(pat, text)
        if m:
            val = _mib(next(g for g in m.groups() if g))
            if val is not None:
                facts[key] = val
    if "reserved_unallocated" not in facts and "reserved_total" in facts and "already_allocated" in facts:
        # torch 1.x .. 2.0 state what PyTorch reserved and what it allocated: the difference is the cache
        facts["reserved_unallocated"] = max(0.0, facts["reserved_total"] - facts["already_allocated"])
    procs = [_mib(s) for s in re.findall(rf"Process \d+ has {size} memory in use", text)]
    listed = [p for p in procs if p is not None]
    if listed:
        facts["listed_processes"] = sum(listed)
        facts["listed_count"] = len(listed)
        facts["listed_max"] = max(listed)
        facts["listed_big"] = sum(1 for p in listed if p >= UNLISTED_OTHERS_FLOOR_MIB)
        own = _own_listed_process(facts, listed)
        if own is not None:
            facts["listed_self"] = own
    return facts


def _own_listed_process(facts: dict[str, float], listed: list[float]) -> float | None:
    """Which of the processes a PyTorch OOM message lists ('Process N has X memory in use', torch 2.1+,
    printed when NVML could not match this process's pid) is this one: NVML's reading of a process is
    its PyTorch memory (allocated plus cached) and its CUDA context and library workspaces, so exactly
    one listed figure within that allowance above PyTorch's own is this process. None when none or
    several fit."""
    if "allocated_by_torch" not in facts:
        return None
    own_torch = facts["allocated_by_torch"] + facts.get("reserved_unallocated", 0.0)
    fits = [p for p in listed if own_torch <= p <= own_torch + NON_TORCH_ALLOWANCE_MIB]
    return fits[0] if len(fits) == 1 else None


def _nothing_freed_yet(facts: dict[str, float]) -> bool:
    """A PyTorch OOM message whose cache holds next to nothing freed and whose request is weight-sized."""
    cache, tried = facts.get("reserved_unallocated"), facts.get("tried")
    return (
        cache is not None
        and tried is not None
        and cache < NOTHING_FREED_MIB
        and tried < LARGEST_WEIGHT_TENSOR_MIB
    )


def _fraction_cap(facts: dict[str, float]) -> str | None:
    """A sentence when a PyTorch OOM message shows a per-process limit below the card's capacity that the
    request would cross: torch.cuda.set_per_process_memory_fraction (TGI's and LoRAX's
    --cuda-memory-fraction, a framework's own share) makes the caching allocator refuse what passes
    'N GiB allowed', whatever the card has free, so the process ran out of its budget; None otherwise."""
    allowed, total, tried = facts.get("allowed"), facts.get("total"), facts.get("tried")
    if allowed is None or total is None or tried is None or allowed >= 0.97 * total:
        return None
    used = facts.get("reserved_total", facts.get("this_process", 0.0))
    if used + tried < allowed:
        return None  # the limit was not what stopped it
    return (
        f"the process reached its own limit of {allowed / 1024:.2f} GiB of the card's {total / 1024:.1f} GiB "
        "(torch.cuda.set_per_process_memory_fraction, set by the program or the framework around it, "
        "e.g. --cuda-memory-fraction): its budget ran out, whatever the card had free"
    )


def _plenty_free(facts: dict[str, float]) -> str | None:
    """A sentence when a PyTorch OOM message says the card had ten times the request free, and at least
    5% of the card: not a shortage of memory; None otherwise."""
    free, tried, total = facts.get("free"), facts.get("tried"), facts.get("total")
    if free is None or tried is None or total is None:
        return None
    if free < 10 * tried or free < 0.05 * total:
        return None
    if _fraction_cap(facts) is not None:
        return None  # the process's own budget ran out: a shortage, though the card had room
    head = f"{free / 1024:.1f} GiB of {total / 1024:.1f} GiB free for a {tried:.0f} MiB request"
    head += ": the card had room"
    return (
        f"{head}; the allocation failed for another reason (vLLM's sleep-mode allocator, a vGPU or MIG limit)"
    )


# PyTorch's caching allocator refuses any request of 2^60 bytes and up in these words, before the driver
_MORE_THAN_EB = re.compile(r"Tried to allocate more than \d+ ?EB")


def _no_shortage(facts: dict[str, float], text: str) -> tuple[str, float, str] | None:
    """Why an OOM line is not a memory shortage, with the weight it keeps and the source of the reading:
    a corrupt request size (over CORRUPT_REQUEST_MIB, or PyTorch's 'more than 1EB' guard), or a request
    the free memory held many times over (_plenty_free); None for a real shortage."""
    if facts.get("tried", 0.0) >= CORRUPT_REQUEST_MIB or _MORE_THAN_EB.search(text):
        shown = f"{facts['tried'] / 2**20:,.0f} TiB" if "tried" in facts else "more than 1 EiB"
        return (
            f"one request of {shown}, more than any machine has: the size is corrupt (an overflow, or a "
            "length from a failed collective), so this OOM is a bug's symptom",
            CORRUPT_REQUEST_WEIGHT,
            "c10/cuda/CUDACachingAllocator.cpp (the OOM message's request size; 'Tried to allocate more "
            "than 1EB memory' is malloc's own check on sizes of 2^60 bytes and up)",
        )
    plenty = _plenty_free(facts)
    if plenty is not None:
        return plenty, PLENTY_FREE_WEIGHT, "c10/cuda/CUDACachingAllocator.cpp (the OOM message's figures)"
    return None


def _add_once(extra: list[Evidence], ev: Evidence) -> None:
    """Append a piece of evidence unless the list holds it (several signatures can hit one line)."""
    if ev not in extra:
        extra.append(ev)


def _graphs_were_captured(text: str) -> bool:
    """PyTorch's OOM message names memory 'allocated in private pools (e.g., CUDA Graphs)' only when
    such pools hold memory (c10/cuda/CUDACachingAllocator.cpp, torch 2.1 .. 2.13): graphs existed, so
    start-up had reached graph capture."""
    return "private pools" in text


# What a process holds on the GPU outside PyTorch's caching allocator (CUDA context, cuBLAS and NCCL
# workspaces), which torch 1.x .. 2.0's OOM message does not count: an allowance, not a measurement.
NON_TORCH_ALLOWANCE_MIB = 1536.0
# Below this, memory in use that no process accounts for is a desktop session or rounding, not a job.
UNLISTED_OTHERS_FLOOR_MIB = 4096.0


def _nvml_blind(facts: dict[str, float]) -> bool | None:
    """Whether the OOM message's 'this process has N memory in use' (NVML's reading, torch 2.1+) missed the
    process: True when it is below what PyTorch itself allocated (0 bytes in some containers and VMs),
    False when it covers it, None when the message has no reading or no allocation to judge it by."""
    allocated = facts.get("allocated_by_torch", 0.0)
    if "this_process" not in facts or allocated <= 0.0:
        return None
    return facts["this_process"] < allocated


def _other_process_mib(facts: dict[str, float]) -> float | None:
    """Memory held by other processes according to a PyTorch OOM message (None if it doesn't say)."""
    total, free = facts.get("total"), facts.get("free")
    remainder: float | None = None
    if total is not None and free is not None:
        if "this_process" in facts:
            blind = _nvml_blind(facts)
            if blind is False:
                # torch 2.1+: NVML found this process; what the card uses beyond it is someone else's,
                # listed or not (processes of other containers are not listed)
                remainder = total - free - facts["this_process"]
            elif blind:
                # NVML's reading is below what PyTorch itself allocated (0 bytes in a container's pid
                # namespace): count this process as PyTorch's allocations and reserve plus an allowance
                # for its context, as for torch 1.x below
                own = facts["allocated_by_torch"] + facts.get("reserved_unallocated", 0.0)
                remainder = total - free - own - NON_TORCH_ALLOWANCE_MIB
        elif "reserved_total" in facts and "listed_processes" not in facts:
            # torch 1.x .. 2.0 states only what PyTorch reserved: the rest of the used memory, less an
            # allowance for this process's own CUDA context and library workspaces
            remainder = total - free - facts["reserved_total"] - NON_TORCH_ALLOWANCE_MIB
    if remainder is not None and remainder >= UNLISTED_OTHERS_FLOOR_MIB:
        return remainder
    if "listed_processes" not in facts and remainder is not None:
        return 0.0
    if "listed_self" in facts and "this_process" not in facts:
        # one listed process holds what PyTorch says this one holds: the others are other jobs
        return facts["listed_processes"] - facts["listed_self"]
    if "listed_processes" in facts and "this_process" not in facts and facts.get("listed_big", 0) >= 2:
        # two or more listed processes each hold gigabytes: whichever of them is this one, the others
        # are jobs of their own (sibling ranks' contexts on device 0 hold a few hundred MiB)
        return facts["listed_processes"] - facts["listed_max"]
    if "listed_processes" not in facts or "this_process" not in facts:
        # without "this process has", a listed process may be this one (pid namespaces differ in
        # containers), and the others may be sibling ranks' CUDA contexts on device 0 (TensorRT-LLM,
        # torch.distributed), so the line does not say that another job held the card
        return None
    own = facts.get("this_process", 0.0)
    others = facts["listed_processes"] - own
    return max(0.0, others)


def _gather(ctx: _Context) -> dict[str, _Candidate]:
    pb = ctx.pb
    cands: dict[str, _Candidate] = {}

    def cand(cause: str) -> _Candidate:
        if cause not in cands:
            cands[cause] = _Candidate(cause, 0.0)
        return cands[cause]

    weighed: set[int] = set()
    explained = {sid for hit in ctx.scan.hits for sid in hit.signature.explains}
    for hit in ctx.scan.hits:
        sig = hit.signature
        if sig.id in explained:
            continue  # another message in the log says what this line means
        # a message that belongs to one stage (vLLM raises it there) names the stage itself
        stage = sig.stage or hit.stage
        cause, weight = sig.cause, sig.weight
        if sig.id == "kernel.nvrm_xid":
            cause, weight = _xid_cause(pb, hit)
        stated = None
        if cause == "oom" and stage == "unknown":
            # a person's words on the OOM line itself say more than the lines that follow it
            stated = _stated_stage(pb, hit.text)
            if stated is not None:
                stage = stated
        if stage == "unknown":
            stage = _stage_after(ctx.scan, hit.line_no)
        if cause == "oom" and sig.cause_after_load and stage not in ("load", "memory_profiling"):
            cause = sig.cause_after_load
            cand("oom_runtime_under_load").add_hit(hit, AFTER_LOAD_RUNTIME_WEIGHT, stage)
        if cause == "oom":
            by_stage = pb.oom_by_stage_engine.get(ctx.scan.engine, {})
            cause = by_stage.get(stage) or pb.oom_by_stage.get(stage, "oom_runtime_under_load")
            facts = _torch_oom_facts(hit.text)
            no_shortage = _no_shortage(facts, hit.text)
            if no_shortage is not None:
                # the line names no stage's OOM: the card had room for the request many times over (the
                # allocation failed for another reason), or the request is larger than any machine
                explanation, weight, source = no_shortage
                c = cand(cause)
                c.add_hit(hit, weight, stage)
                _add_once(c.extra, Evidence("log", explanation, hit.line_no, source))
                continue
            if stated is not None:
                _add_once(
                    cand(cause).extra,
                    Evidence(
                        "log",
                        f"the OOM line itself says where it happened: stage '{stated}'",
                        hit.line_no,
                        "a person's words on the line (no vLLM landmark in the log); "
                        "playbooks/triage/stages.toml [[stated]]",
                    ),
                )
            if stage == "unknown" and facts.get("tried", 0.0) > facts.get("total", math.inf):
                # One request for more than the whole card: no weight tensor is that large, and the
                # largest activations vLLM ever makes are those of its profiling run (max_num_batched_tokens,
                # the most multimodal items per prompt), which the scheduler never exceeds afterwards
                cause = "oom_sampler_warmup_or_profile_run"
                weight = min(weight, STAGELESS_OOM_WEIGHT)
                cand("oom_runtime_under_load").add_hit(hit, STAGELESS_OOM_ALTERNATIVES[0][1], stage)
                _add_once(
                    cand(cause).extra,
                    Evidence(
                        "log",
                        f"one allocation of {facts['tried'] / 1024:.1f} GiB, more than the whole "
                        f"{facts['total'] / 1024:.1f} GiB card: an activation of the profiling run's "
                        "worst-case batch, not a weight",
                        hit.line_no,
                        "tuner/triage.py (vLLM's profile_run sizes: max_num_batched_tokens, "
                        "--limit-mm-per-prompt)",
                    ),
                )
            elif stage == "unknown" and _nothing_freed_yet(facts) and not _graphs_were_captured(hit.text):
                # PyTorch's cache holds (almost) nothing freed: no forward pass has run, since each frees
                # its activations into the cache; weights are allocated once and kept
                cause = "oom_weights_do_not_fit"
                weight = min(weight, STAGELESS_OOM_WEIGHT)
                for alt, w in STAGELESS_NOTHING_FREED_ALTERNATIVES:
                    cand(alt).add_hit(hit, w, stage)
                _add_once(
                    cand(cause).extra,
                    Evidence(
                        "log",
                        f"{facts['reserved_unallocated']:.0f} MiB reserved by PyTorch but unallocated and "
                        f"{facts['tried']:.0f} MiB requested: nothing freed yet, as while weights are "
                        "created; a forward pass (profiling, warm-up, serving) leaves freed activations "
                        "in the cache",
                        hit.line_no,
                        "c10/cuda/CUDACachingAllocator.cpp (the OOM message's cache figures)",
                    ),
                )
            elif stage == "unknown" and not _graphs_were_captured(hit.text):
                # No landmark says how far start-up got and nothing says CUDA graphs existed: the
                # OOM line alone cannot tell loading from serving, so say so in the confidence.
                weight = min(weight, STAGELESS_OOM_WEIGHT)
                for alt, w in STAGELESS_OOM_ALTERNATIVES:
                    cand(alt).add_hit(hit, w, stage)
            if stage in ("unknown", "load") and hit.line_no not in weighed:
                weighed.add(hit.line_no)
                over = _weights_exceed_card(ctx, facts)
                if over is not None:
                    # the model's weights alone are larger than the card: the OOM was at load,
                    # whatever else held memory (vLLM's accounting: weights come first)
                    c = cand("oom_weights_do_not_fit")
                    c.add_hit(hit, WEIGHTS_EXCEED_CARD_WEIGHT, "load")
                    c.stage = "load"
                    c.extra.append(Evidence("log", over, hit.line_no, "tuner/triage_weights.py"))
            others = _other_process_mib(facts)
            total = facts.get("total") or ctx.gpu_total_mib
            if others is not None and total and others >= 0.2 * total and stage in EARLY_STAGES:
                c = cand("startup_free_memory_below_target")
                c.groups.setdefault("others_mib", f"{others:.0f}")
                c.groups.setdefault("total_mib", f"{total:.0f}")
                if _nvml_blind(facts) and stage != "load":
                    # NVML did not see this process (0 bytes in a container's pid namespace): past
                    # loading, the memory no one accounts for may be this process's own outside
                    # PyTorch's allocator (a colocated engine's pool, NCCL's buffers, CUDA graphs), so
                    # another job is an alternative only; while loading, a process holds no such pools
                    c.add_hit(hit, min(0.9, weight) * 0.6, stage)
                else:
                    c.add_hit(hit, min(0.9, weight), stage)
                    weight *= 0.6
            capped = _fraction_cap(facts)
            if capped is not None:
                source = "c10/cuda/CUDACachingAllocator.cpp (the OOM message's 'allowed' figure)"
                _add_once(cand(cause).extra, Evidence("log", capped, hit.line_no, source))
                cand(cause).groups.setdefault("allowed_mib", f"{facts['allowed']:.0f}")
        cand(cause).add_hit(hit, weight, stage)

    # Rules on a traceback's shape (the exception class and where it was raised): weaker than any message
    # signature, they name a cause only when no message is known (for example a ValueError raised while
    # vLLM validated its configuration).
    for rule in pb.structural:
        for exc in ctx.scan.exceptions:
            if rule.matches(exc):
                stage = rule.signature.stage or _stage_after(ctx.scan, exc.line_no)
                hit = Hit(rule.signature, exc.line_no, exc.text, {"exception": exc.exc}, stage)
                cand(rule.signature.cause).add_hit(hit, rule.signature.weight, stage)
                break

    if ctx.kernel is not None:
        for hit in ctx.kernel.hits:
            cause, weight = hit.signature.cause, hit.signature.weight
            if hit.signature.id == "kernel.nvrm_xid":
                cause, weight = _xid_cause(pb, hit)
            if cause == "host_ram_oom_killed" and killed_by_sigkill(ctx.exit_code):
                weight = max(weight, 0.97)
            c = cand(cause)
            c.add_hit(hit, weight, ctx.scan.stage)

    if killed_by_sigkill(ctx.exit_code):
        c = cand("host_ram_oom_killed")
        c.confidence = max(c.confidence, 0.5) if c.hits else 0.5
        if c.hits:
            c.confidence = min(0.99, c.confidence + 0.03)
        c.extra.append(
            Evidence(
                "exit",
                f"exit status {ctx.exit_code}: killed by SIGKILL",
                None,
                "SIGKILL is what the kernel OOM killer sends",
            )
        )
        c.stage = ctx.scan.stage if c.stage == "unknown" else c.stage

    shm = cands.get("shm_insufficient")
    read_at = ctx.scan.weights_read_line
    if (
        shm is not None
        and read_at is not None
        and shm.sig_ids == {"shm.bus_error"}
        and all(h.line_no > read_at and h.stage == "load" for h in shm.hits)
    ):
        # a SIGBUS while the checkpoint's shards are read: safetensors maps each file (mmap), and a page the
        # kernel cannot read back (a file truncated or replaced while mapped, a disk or network file
        # system error) raises SIGBUS; /dev/shm's transports were set up before loading began
        shm.confidence = min(shm.confidence, CUT_TRACEBACK_HINT)
        shm.extra.append(
            Evidence(
                "log",
                "a bus error while the checkpoint's shards were read (a memory-mapped file, not /dev/shm)",
                shm.hits[0].line_no,
                "the bus error came while the checkpoint's shards were read: safetensors memory-maps each "
                "file, and a page that cannot be read back (a truncated or replaced file, a disk or network "
                "file system error) raises SIGBUS; /dev/shm was set up before loading began",
            )
        )

    host = cands.get("host_ram_oom_killed")
    # SGLang's scheduler and detokenizer processes answer their own exception with kill_parent_process /
    # kill_process_tree, which SIGKILLs the launcher (python/sglang/srt/managers/scheduler.py
    # run_scheduler_process and utils.py kill_process_tree: itself.kill(), 0.2 .. 0.5): a 'Killed' after an
    # SGLang traceback is that teardown, the exception above it the failure
    sglang_teardown = ctx.scan.engine == "sglang" and any(
        any("/sglang/" in f for f in e.frames) for e in ctx.scan.exceptions
    )
    if (
        host is not None
        and (ctx.scan.self_sigkill or sglang_teardown)
        and not (ctx.kernel is not None and ctx.kernel.hits)
        and host.sig_ids <= SIGKILL_ONLY_SIGNATURES
    ):
        # the server killed its own process tree after a worker's error: the SIGKILL says nothing about RAM
        host.confidence = min(host.confidence, CUT_TRACEBACK_HINT)
        host.extra.append(Evidence("log", *SELF_SIGKILL_EVIDENCE[ctx.scan.engine == "sglang"]))

    tag, option = ctx.scan.args.get("model_tag"), ctx.scan.args.get("model_option")
    if isinstance(tag, str) and isinstance(option, str) and tag.rstrip("/") != option.rstrip("/"):
        # `vllm serve A --model B`: the positional model tag replaces --model (vllm/entrypoints/cli/
        # serve.py: args.model = args.model_tag, 0.5 .. 0.32), so B is ignored and A is loaded
        c = cand("config_error_not_resource")
        c.confidence = max(c.confidence, MODEL_TAG_CONFLICT_WEIGHT)
        c.extra.append(
            Evidence(
                "log",
                f"vllm serve {tag} ... --model {option}",
                None,
                f"the positional model '{tag}' replaces --model '{option}' (vllm/entrypoints/cli/serve.py): "
                f"vLLM loads '{tag}'; give the model once, as the positional argument",
            )
        )
        c.stage = "load" if c.stage == "unknown" else c.stage

    stopped = _stopped_while_loading(ctx.scan)
    if stopped is not None and not any(c.hits for c in cands.values()) and ctx.exit_code in (None, -9, 137):
        # The log's last line is weight-loading progress and nothing failed: Python never got to print an
        # error, which is what a SIGKILL does; loading is when host RAM peaks (shards are read through it).
        c = cand("host_ram_oom_killed")
        c.confidence = max(c.confidence, SILENT_LOAD_DEATH_WEIGHT)
        c.extra.append(
            Evidence(
                "log",
                stopped[1][:300],
                stopped[0],
                "the log stops here, during weight loading, with no error: a process killed by SIGKILL "
                "(the kernel or a container's OOM killer) prints nothing; check dmesg / the exit status",
            )
        )
        c.stage = "load"
    return cands


_SHARD_PROGRESS = re.compile(r"Loading (?:safetensors |pt )?checkpoint shards:\s*(\d+)%[^\n]*?(\d+)/(\d+)")


def _stopped_while_loading(res: ScanResult) -> tuple[int, str] | None:
    """The last line when it is unfinished checkpoint-shard progress with at least one shard read (vLLM's
    weight_utils.py tqdm bar, transformers' 'Loading checkpoint shards'), else None."""
    for no, text in reversed(res.tail):
        if not text.strip() or re.fullmatch(r"\s*(\([^)]*\)\s*)?", text):
            continue  # a blank line or a bare '(Worker pid=N)' prefix before the bar
        m = _SHARD_PROGRESS.search(text)
        # at 0/N the bar has only been drawn: an excerpt cut there says nothing of how loading ended
        if m and 0 < int(m.group(2)) < int(m.group(3)):
            return no, text.strip()
        return None
    return None


def _stage_after(res: ScanResult, line_no: int, window: int = 100) -> str:
    """The stage named by the traceback printed just after an error line (a log excerpt may start
    with the error, and some loggers print the message before its traceback)."""
    found = [s for s, first in res.stage_first_line.items() if line_no < first <= line_no + window]
    return max(found, key=STAGES.index) if found else "unknown"


_PRIVATE_POOLS = re.compile(r"allocated in private pools \(e\.g\., CUDA Graphs\)")


def _weights_exceed_card(ctx: _Context, facts: dict[str, float]) -> str | None:
    """A sentence when the weights of the model the run loaded (per GPU, at its tensor-parallel size) are
    more than the whole card the OOM message names; None when unknown or when they fit."""
    from tuner.triage_weights import model_name, model_weights

    total_mib = facts.get("total") or ctx.gpu_total_mib
    name = model_name(ctx.argv, ctx.scan.args, ctx.plan)
    if not total_mib or not name:
        return None
    try:
        mw = model_weights(name, ctx.env, ctx.arg("dtype"), ctx.arg("quantization"))
    except Exception:  # a model folder that cannot be read here
        return None
    if mw is None:
        return None
    tp = int(ctx.num("tensor_parallel_size") or 1) * int(ctx.num("pipeline_parallel_size") or 1)
    per_gpu_gib = mw.total_bytes / max(1, tp) / 2**30
    total_gib = total_mib / 1024
    if per_gpu_gib <= total_gib:
        return None
    return (
        f"the weights of {name} take about {per_gpu_gib:.1f} GiB per GPU ({mw.how}; "
        f"tensor_parallel_size={tp}), more than the {total_gib:.1f} GiB card"
    )


def _first_oom_facts(top: _Candidate) -> dict[str, float] | None:
    """The numbers of the first CUDA OOM message among a diagnosis's evidence (None when none is one)."""
    return next((_torch_oom_facts(h.text) for h in top.hits if h.signature.cause == "oom"), None)


def _stated_stage(pb: Playbook, text: str) -> str | None:
    """The stage a person's sentence about an OOM names ('CUDA OOM during sampler warmup', 'cuda oom when
    capturing cuda graphs'); the furthest one when it names several, None when it names none."""
    text = _PRIVATE_POOLS.sub("", text)  # PyTorch's own clause, not a person's words
    found = [stage for stage, rx in pb.stated if rx.search(text)]
    return max(found, key=STAGES.index) if found else None


def _xid_cause(pb: Playbook, hit: Hit) -> tuple[str, float]:
    try:
        code = int(hit.groups.get("xid", "-1"))
    except ValueError:
        code = -1
    entry = pb.xid.get(code)
    if entry is None:
        return "gpu_hardware_fault", 0.5
    return entry.cause, entry.weight


def _later(a: str | None, b: str) -> str:
    if a is None or a not in STAGES:
        return b
    if b not in STAGES:
        return a
    return a if STAGES.index(a) >= STAGES.index(b) else b


def _weigh(ctx: _Context, cands: dict[str, _Candidate]) -> list[_Candidate]:
    """Apply the rules that need several facts at once; return candidates best first."""
    tel = ctx.telemetry
    total = ctx.gpu_total_mib or (tel.total_mib if tel else None)
    strong_other = [
        c for c in cands.values() if c.confidence >= 0.8 and c.cause != "nccl_multi_gpu_comm_failure"
    ]
    if "nccl_multi_gpu_comm_failure" in cands and strong_other:
        # NCCL errors follow a rank's death from another cause (watchdog, aborted communicator).
        cands["nccl_multi_gpu_comm_failure"].confidence *= 0.7

    # Another process held GPU memory: KV-cache failures and early OOMs are start-up free-memory problems.
    others = ctx.other_gpu_mib
    if others is not None and total and others >= 0.2 * total:
        ev = Evidence(
            "telemetry",
            f"other processes held {others:.0f} MiB of {total:.0f} MiB on the GPU",
            None,
            "gpu-processes.csv",
        )
        _blame_other_process(cands, ev, {"others_mib": f"{others:.0f}", "total_mib": f"{total:.0f}"})
    for shared in (_uneven_ranks(ctx), _shared_gpu_in_table(ctx)):
        if shared is not None:
            _blame_other_process(cands, shared, {})

    if tel is not None:
        if tel.at_capacity(total):
            ev = Evidence("telemetry", _tel_text(tel, total), None, f"{tel.format}: memory at capacity")
            for cause in GPU_OOM_CAUSES:
                if cause in cands and cands[cause].hits:
                    cands[cause].confidence = min(0.99, cands[cause].confidence + 0.03)
                    cands[cause].extra.append(ev)
            if not cands and ctx.exit_code not in (None, 0):
                c = _Candidate("oom_runtime_under_load", 0.45, stage=ctx.scan.stage)
                c.extra.append(ev)
                cands[c.cause] = c
        elif tel.peak_used_mib is not None:
            known = tel.total_mib or total
            where = "memory below capacity" if known else "the GPU's capacity is not recorded"
            ev = Evidence("telemetry", _tel_text(tel, total), None, f"{tel.format}: {where}")
            for cause in GPU_OOM_CAUSES:
                if cause in cands:
                    cands[cause].extra.append(ev)

    ranked = sorted(cands.values(), key=lambda c: (-c.confidence, c.first_line))
    return [c for c in ranked if c.confidence > 0]


def _blame_other_process(cands: dict[str, _Candidate], ev: Evidence, groups: dict[str, str]) -> None:
    """Memory held by another process explains a KV-cache failure or an early OOM: name the start-up
    free-memory problem, with the failure's own evidence, above the failure's usual cause."""
    for cause in (
        "no_kv_cache_memory",
        "kv_cache_too_small_for_max_model_len",
        "oom_weights_do_not_fit",
        "oom_sampler_warmup_or_profile_run",
    ):
        if cause in cands and cands[cause].confidence >= 0.5:
            src = cands[cause]
            c = cands.setdefault(
                "startup_free_memory_below_target", _Candidate("startup_free_memory_below_target", 0.0)
            )
            c.confidence = max(c.confidence, min(0.9, src.confidence))
            c.hits.extend(src.hits)
            c.extra.append(ev)
            c.first_line = min(c.first_line, src.first_line)
            c.stage = src.stage
            for key, value in groups.items():
                c.groups.setdefault(key, value)
            src.confidence *= 0.6


# Tensor-parallel ranks load equal shards of one model, so their KV budgets differ by little; a rank with
# this much less (and under half of the best one's) had memory taken on its GPU by something else.
UNEVEN_RANKS_GIB = 2.0


def _uneven_ranks(ctx: _Context) -> Evidence | None:
    """Evidence when the workers' 'Available KV cache memory' values are far apart (None otherwise, and
    under pipeline parallelism, whose stages hold different layers)."""
    kv = ctx.scan.kv_available
    if len(kv) < 2 or any("PP" in name for name in kv) or (ctx.num("pipeline_parallel_size") or 1) > 1:
        return None
    low_name, low = min(kv.items(), key=lambda item: item[1])
    high_name, high = max(kv.items(), key=lambda item: item[1])
    if high - low < UNEVEN_RANKS_GIB or low >= 0.5 * high:
        return None
    return Evidence(
        "log",
        f"Available KV cache memory: {low_name} {low:.2f} GiB, {high_name} {high:.2f} GiB",
        None,
        "ranks of one model hold equal shards (vllm/v1/worker/gpu_worker.py determine_available_memory "
        f"measures each GPU): {low:.2f} GiB against {high:.2f} GiB means another process held memory on "
        f"{low_name}'s GPU (nvidia-smi on that GPU shows it)",
    )


# A process holding at least this much of a GPU is a model (or a training job), not a bare CUDA context
# (300-600 MiB) such as a front end's or a monitoring tool's.
TABLE_PROCESS_MIB = 1024.0


def _shared_gpu_in_table(ctx: _Context) -> Evidence | None:
    """Evidence when an nvidia-smi or nvitop process table pasted into the log shows two or more processes
    holding GPU memory on one GPU: one engine holds one GPU per rank, so the others took part of it."""
    by_gpu: dict[int, dict[int, tuple[float, str]]] = {}
    for gpu, pid, mib, row in ctx.scan.gpu_processes:
        if mib >= TABLE_PROCESS_MIB:
            by_gpu.setdefault(gpu, {})[pid] = (mib, row)
    shared = {gpu: procs for gpu, procs in by_gpu.items() if len(procs) >= 2}
    if not shared:
        return None
    gpu, procs = min(shared.items())
    held = ", ".join(f"pid {pid} {mib:.0f} MiB" for pid, (mib, _) in sorted(procs.items()))
    return Evidence(
        "log",
        next(iter(procs.values()))[1],
        None,
        f"the process table in the log shows {len(procs)} processes holding memory on GPU {gpu} ({held}): "
        "a second engine or job on the same GPU takes memory this run counted on",
    )


def _tel_text(tel: TelemetrySummary, total: float | None) -> str:
    peak = tel.peak_used_mib or 0.0
    parts = [f"GPU memory peaked at {peak:.0f} MiB"]
    if total:
        parts.append(f"of {total:.0f} MiB ({100 * peak / total:.0f}%)")
    if tel.plateau_samples > 1:
        parts.append(f"for {tel.plateau_samples} samples")
    if tel.dropped_after_peak:
        parts.append("then fell (the process released it or died)")
    if tel.util_last is not None and tel.util_peak:
        parts.append(f"; GPU utilisation last {tel.util_last:.0f}% (peak {tel.util_peak:.0f}%)")
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# remediation
# --------------------------------------------------------------------------------------------------
def round_down_len(n: int) -> int:
    """A max_model_len a little under vLLM's estimate, on a round boundary."""
    if n >= 16384:
        return n // 1024 * 1024
    if n >= 2048:
        return n // 256 * 256
    if n >= 256:
        return n // 16 * 16
    return n


def _version_at_least(version: str | None, want: tuple[int, int]) -> bool:
    """True when the logged vLLM version is known and at least ``want`` (major, minor)."""
    if not version:
        return False
    parts = re.findall(r"\d+", version)[:2]
    if len(parts) < 2:
        return False
    return (int(parts[0]), int(parts[1])) >= want


def _f(groups: dict[str, str], key: str) -> float | None:
    try:
        return float(groups[key])
    except (KeyError, ValueError):
        return None


def _util_fitting(free_gib: float, total_gib: float) -> float | None:
    margin = max(0.5, 0.01 * total_gib)
    if total_gib <= 0:
        return None
    util = math.floor((free_gib - margin) / total_gib * 100) / 100
    return util if util >= 0.05 else None


UNQUANTIZED = {
    "bfloat16",
    "float16",
    "float32",
    "half",
    "float",
    "fp16",
    "bf16",
    "torch.bfloat16",
    "torch.float16",
}
WEIGHTS_RESERVE_FRACTION = 0.08  # of a GPU kept out of the weights' share: activation peak, some KV cache


KV_ACTIVATION_ROOM_GIB = 2.0  # per GPU, kept beside the weights: activation peak and some KV cache
PCIE_GEN4_X16_BYTES_S = 25e9  # effective host-to-device bandwidth assumed when the link is not recorded


def _visible_gpus(ctx: _Context, dev: dict[str, Any]) -> tuple[int | None, str]:
    """GPUs the run could use, and where that number comes from (plan.json, telemetry,
    CUDA_VISIBLE_DEVICES in command.json, or the log's world_size / GPU index)."""
    n: float | None = None
    src = ""
    if _num_or_none(dev.get("count")):
        n, src = _num_or_none(dev.get("count")), "plan.json"
    elif ctx.telemetry and ctx.telemetry.gpus:
        n, src = float(ctx.telemetry.gpus), "telemetry"
    visible = ctx.env.get("CUDA_VISIBLE_DEVICES")
    where = "CUDA_VISIBLE_DEVICES in command.json"
    if visible is None and isinstance(ctx.scan.args.get("CUDA_VISIBLE_DEVICES"), str):
        visible = ctx.scan.args["CUDA_VISIBLE_DEVICES"]
        where = "CUDA_VISIBLE_DEVICES on the logged command line"
    if visible is not None:
        listed = len([v for v in visible.split(",") if v.strip()])
        if n is None or listed < n:
            n, src = float(listed), where
    if n is None:
        world = ctx.scan.args.get("world_size")
        index = None
        for hit in ctx.scan.hits:
            m = re.search(r"\bGPU (\d+)(?:;| has a total)", hit.text)
            if m:
                index = int(m.group(1)) + 1
                break
        best = max([v for v in (world, index) if isinstance(v, int)], default=None)
        if best:
            n, src = float(best), "the log (world_size / GPU index)"
    return (int(n) if n else None), src


def _capability(ctx: _Context, dev: dict[str, Any]) -> tuple[tuple[int, int] | None, str]:
    """Compute capability: plan.json's, else from a GPU model name (plan.json, then the log)."""
    from tuner.triage_weights import capability_from_name

    cap = dev.get("compute_capability")
    if isinstance(cap, list) and len(cap) == 2:
        return (int(cap[0]), int(cap[1])), "plan.json"
    for name, where in ((dev.get("name"), "plan.json"), (ctx.scan.gpu_name, "the log")):
        if isinstance(name, str) and name:
            cc = capability_from_name(name)
            if cc:
                return cc, f"{name} in {where}"
    return None, ""


def _weights_remedy(
    ctx: _Context, top: _Candidate, summary: str
) -> tuple[str, dict[str, str | None], list[RemedyOption]]:
    """Argument changes for weights that do not fit, computed from the model the run loaded, ranked:
    more GPUs (no loss of speed or quality), FP8 weights on GPUs with FP8 units (sm_89+), a 4-bit
    checkpoint of the same model (not an argument change), then host-RAM offload (slow). Each is
    proposed only when the numbers show it fits; otherwise the summary says why nothing is safe.

    The weights: plan.json's weights_bytes, else the model named in plan.json / command.json / the
    log resolved by tuner.models (tuner/triage_weights.py), else an estimate from the parameter count
    in its name. The card: PyTorch's OOM message (total, free, 'Tried to allocate'), plan.json, telemetry;
    usable = total x gpu_memory_utilization (vLLM's default 0.9).
    """
    from tuner.triage_weights import ModelWeights, model_name, model_weights

    facts: dict[str, float] = {}
    for hit in top.hits:
        facts = _torch_oom_facts(hit.text)
        if "total" in facts:
            break
    plan = ctx.plan
    dev: dict[str, Any] = plan["device"] if isinstance(plan.get("device"), dict) else {}
    total = facts.get("total") or _num_or_none(dev.get("total_bytes"), 2**20) or ctx.gpu_total_mib
    util = ctx.num("gpu_memory_utilization") or _num_or_none(plan.get("gpu_memory_utilization")) or 0.9
    tp = int(ctx.num("tensor_parallel_size") or _num_or_none(plan.get("tensor_parallel_size")) or 1)
    gpus, gpus_src = _visible_gpus(ctx, dev)
    cc, cc_src = _capability(ctx, dev)
    quant = ctx.arg("quantization")
    name = model_name(ctx.argv, ctx.scan.args, plan)
    mw: ModelWeights | None = None
    if name:
        try:
            mw = model_weights(name, ctx.env, ctx.arg("dtype"), quant)
        except Exception:  # a model folder that cannot be read here: fall back to plan.json alone
            mw = None
    weights_b = _num_or_none(plan.get("weights_bytes"))
    scheme = str(plan.get("weights_scheme") or "")
    how = f"plan.json ({plan.get('weights_method') or 'gputune plan'})" if weights_b else ""
    if not weights_b and mw is not None:
        weights_b, how = mw.total_bytes, mw.how
    unquantized = (
        (scheme in UNQUANTIZED and quant in (None, "", "None"))
        if weights_b and how.startswith("plan.json") and scheme
        else bool(mw and mw.unquantized)
    )
    heads = mw.heads if mw else None
    if heads is None and isinstance(plan.get("model"), dict):
        heads = int(plan["model"].get("num_attention_heads") or 0) or None
    gib = 2.0**30
    if total:
        summary += f" The GPU has {total / 1024:.1f} GiB in all."
    usable = total * 2**20 * util if total else None  # bytes per GPU vLLM may use
    per_gpu = weights_b / tp if weights_b else None
    room = KV_ACTIVATION_ROOM_GIB * gib
    opts: list[RemedyOption] = []
    notes: list[RemedyOption] = []
    unsafe: list[str] = []
    if per_gpu and weights_b:
        summary += (
            f" The weights of {name or 'the model'} take about {weights_b / gib:.1f} GiB"
            f" ({how}), {per_gpu / gib:.1f} GiB per GPU at tensor_parallel_size={tp}"
        )
        if usable:
            summary += f"; {usable / gib:.1f} GiB is usable per GPU (gpu_memory_utilization={util:g})"
        else:
            need = (per_gpu + room) / util / gib
            on80 = next(
                (
                    k
                    for k in (2, 4, 8, 16)
                    if (heads is None or heads % k == 0) and weights_b / k + room <= 80 * util * gib
                ),
                None,
            )
            notes.append(
                RemedyOption(
                    "the log does not state the GPU's memory: at "
                    f"tensor_parallel_size={tp} each GPU needs about {need:.0f} GiB"
                    + (f"; on 80 GiB cards --tensor-parallel-size {on80} would hold it" if on80 else "")
                )
            )
        summary += "."
    if per_gpu and usable and per_gpu + room <= usable:
        summary += (
            f" The weights should fit with {KV_ACTIVATION_ROOM_GIB:g} GiB to spare, so something else took "
            "the memory (another process on the GPU, or a larger checkpoint than counted): check nvidia-smi."
        )
        return summary, {}, [RemedyOption(f"not proposed: weights changes ({how})")]

    # 1. more GPUs
    if weights_b and usable:
        fits = [
            k
            for k in range(tp + 1, 65)
            if (k & (k - 1) == 0 if heads is None else heads % k == 0) and weights_b / k + room <= usable
        ]
        k = fits[0] if fits else None
        if k and gpus and k <= gpus:
            opts.append(
                RemedyOption(
                    f"shard the weights over {k} GPUs: {weights_b / k / gib:.1f} GiB each "
                    f"({gpus} visible per {gpus_src}"
                    + (
                        f"; {heads} attention heads divide by {k}"
                        if heads
                        else f"; the attention heads must divide by {k}"
                    )
                    + ")",
                    {"--tensor-parallel-size": str(k)},
                )
            )
        elif k:
            seen = (
                f"only {gpus} visible per {gpus_src}"
                if gpus
                else "the run did not record how many are visible"
            )
            unsafe.append(f"--tensor-parallel-size {k} needs {k} such GPUs ({seen})")
        else:
            unsafe.append("no tensor-parallel size up to 64 GPUs of this size holds the weights")
    elif gpus and gpus > tp and not weights_b:
        unsafe.append("more GPUs may help, but the model's size is unknown, so not how many")
    # 2. FP8 weights
    fp8_b = (mw.fp8_bytes if mw and mw.unquantized else None) or (weights_b * 0.53 if weights_b else None)
    if unquantized:
        if cc is None:
            unsafe.append("--quantization fp8 needs a GPU of sm_89+ and this run did not record the GPU")
        elif cc < (8, 9):
            unsafe.append(f"--quantization fp8 needs sm_89+ for full speed (this GPU is sm_{cc[0]}{cc[1]})")
        elif fp8_b and usable and fp8_b / tp + room > usable:
            unsafe.append(f"FP8 weights ({fp8_b / tp / gib:.1f} GiB per GPU) would still not fit")
        else:
            size = f" to about {fp8_b / tp / gib:.1f} GiB per GPU" if fp8_b else ""
            opts.append(
                RemedyOption(
                    f"quantize the weights to FP8 at load time{size} (GPU sm_{cc[0]}{cc[1]} per {cc_src} has "
                    "FP8 units; small accuracy cost)",
                    {"--quantization": "fp8"},
                )
            )
    # 3. a 4-bit checkpoint of the same model (not an argument change: another --model)
    int4_b = mw.int4_bytes if mw else None
    if int4_b and (not weights_b or int4_b < weights_b):
        fit = ""
        if usable:
            fit = " (fits)" if int4_b / tp + room <= usable else " (would still not fit at this size)"
        # ranked before host-RAM offload: no PCIe stream per step, at a small accuracy cost
        opts.append(
            RemedyOption(
                f"serve a 4-bit AWQ/GPTQ checkpoint of {name}: about {int4_b / tp / gib:.1f} GiB per GPU{fit}"
            )
        )
    # 4. host-RAM offload (vLLM's --cpu-offload-gb is per GPU)
    old = ctx.num("cpu_offload_gb") or 0.0
    if per_gpu and usable:
        new = math.ceil((per_gpu - usable + room) / gib)
        host = _num_or_none(plan.get("host_ram_available"), gib)
        bw = _num_or_none(plan.get("pcie_bandwidth_bytes_s"))
        link = str(plan.get("pcie_source") or "") if bw else "PCIe Gen4 x16 assumed, ~25 GB/s"
        bw = bw or PCIE_GEN4_X16_BYTES_S
        if new <= old:
            unsafe.append(f"--cpu-offload-gb {old:g} already covers the count; the OOM is elsewhere")
        elif new * gib >= per_gpu:
            unsafe.append(
                "offloading would leave no weights on the GPU: the card is too small for this model"
            )
        elif host is not None and new * tp > 0.8 * host:
            unsafe.append(
                f"--cpu-offload-gb {new} x {tp} GPU(s) exceeds 80% of the {host:.0f} GiB host RAM free"
            )
        else:
            ceiling = bw / (new * gib)
            ram = (
                f"the host has {host:.0f} GiB free"
                if host is not None
                else f"host RAM was not recorded: it needs {new * tp} GiB free"
            )
            opts.append(
                RemedyOption(
                    f"keep {new} GiB of weights per GPU in host RAM with --cpu-offload-gb {new} ({ram}); "
                    f"slow: they cross PCIe every step, at most ~{ceiling:.1f} decode steps (tokens per "
                    f"sequence) per second ({link})",
                    {"--cpu-offload-gb": str(new)},
                )
            )
    elif "tried" in facts and "free" in facts and facts["tried"] > facts["free"]:
        low = math.ceil((facts["tried"] - facts["free"]) / 1024 * 1.1 + 0.5)
        notes.append(
            RemedyOption(
                f"at least {low} GiB short (the failed allocation minus what was free); the whole model's "
                "shortfall is unknown without its size, so no --cpu-offload-gb is proposed"
            )
        )
    first = next((o for o in opts if o.flag_changes), None)
    flags: dict[str, str | None] = dict(first.flag_changes) if first else {}
    if first is not None:
        summary += f" Next: {first.summary}."
        better = [o for o in opts[: opts.index(first)] if not o.flag_changes]
        if better:
            summary += f" Better where another checkpoint is acceptable: {better[0].summary}."
    else:
        if not per_gpu:
            why = "the model's size is not known from the run directory or the log"
            if name:
                why = f"{name!r} could not be resolved here and its name holds no parameter count"
        elif not usable:
            why = "the log does not state the GPU's memory"
        else:
            why = "; ".join(unsafe) or "no change fits"
        summary += (
            f" No argument change is known to be safe from what this run recorded ({why}): use a quantized "
            "checkpoint (AWQ/GPTQ int4) or a larger GPU."
        )
    rest = [o for o in opts if o is not first]
    return summary, flags, rest + notes + [RemedyOption(f"not proposed: {u}") for u in unsafe]


def _num_or_none(value: Any, divisor: float = 1.0) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        return None
    return float(value) / divisor


def _remedy(ctx: _Context, top: _Candidate) -> Remediation:
    pb = ctx.pb
    info = pb.causes.get(top.cause, {})
    g = top.groups
    base_alts = [RemedyOption(str(a)) for a in info.get("alternatives", [])]
    summary = str(info.get("summary", ""))
    if top.reading is not None:
        # no message is known, so no argument is: the cause's general advice, said to be a reading
        title = str(info.get("title", top.cause))
        words = ", ".join(top.reading.words)
        summary = (
            f"No known message names the cause; the words of the failure lines ({words}) "
            f"are those of this cause in the labelled real failures: {title}. Read the lines shown as "
            f"evidence to confirm. {summary}"
        )
        if _engine(ctx, top) != "vllm":
            base_alts = [a for a in base_alts if "--" not in a.summary]
        return Remediation(summary=summary.strip(), alternatives=tuple(base_alts))
    flags: dict[str, str | None] = {}
    env: dict[str, str] = {}
    alts: list[RemedyOption] = []
    util = ctx.num("gpu_memory_utilization")
    cpu = ctx.scan.cpu_backend

    if top.cause == "kv_cache_too_small_for_max_model_len":
        mml = _f(g, "max_model_len") or ctx.num("max_model_len")
        est = _f(g, "estimated_max_len") or _f(g, "kv_tokens")
        needed, avail = _f(g, "needed_gib"), _f(g, "available_gib")
        if est is None and mml and needed and avail:
            est = mml * avail / needed
        if mml and needed is not None and avail is not None:
            summary = (
                f"One sequence of max_model_len={int(mml)} tokens needs {needed:g} GiB of KV cache, but only "
                f"{avail:g} GiB is available."
            )
        elif mml and est:
            summary = f"max_model_len={int(mml)} is larger than the {int(est)} tokens the KV cache can hold."
        blocks = _f(g, "mamba_blocks")
        if blocks is not None:
            # a hybrid model's Mamba cache holds one state per running sequence: the number of sequences,
            # not the length, is what does not fit (vLLM's own advice names --max-num-seqs)
            seqs = _f(g, "max_num_seqs")
            summary = (
                f"The Mamba cache holds {int(blocks)} sequence states, fewer than --max-num-seqs "
                f"{int(seqs) if seqs else '?'}: each running sequence needs one. Use --max-num-seqs "
                f"{int(blocks)}, or give the cache more memory."
            )
            flags["--max-num-seqs"] = str(int(blocks))
            est = None
        if est and est >= 16:
            new_len = round_down_len(int(est))
            flags["--max-model-len"] = str(new_len)
            summary += f" vLLM estimates that {int(est)} tokens fit: use --max-model-len {new_len}."
        if cpu:
            space = math.ceil((needed or 0) * 1.1) + 1 if needed else None
            if space:
                alts.append(
                    RemedyOption(
                        f"give the CPU KV cache {space} GiB (VLLM_CPU_KVCACHE_SPACE={space})",
                        env_changes={"VLLM_CPU_KVCACHE_SPACE": str(space)},
                    )
                )
        else:
            if util is None or util < 0.95:
                new_u = min(0.95, round((util or 0.9) + 0.05, 2))
                alts.append(
                    RemedyOption(
                        f"raise --gpu-memory-utilization to {new_u:.2f} if the GPU has it free",
                        {"--gpu-memory-utilization": f"{new_u:.2f}"},
                    )
                )
            if str(ctx.arg("kv_cache_dtype") or "auto") == "auto":
                alts.append(
                    RemedyOption(
                        "store the KV cache in FP8 (halves KV memory; small accuracy cost)",
                        {"--kv-cache-dtype": "fp8"},
                    )
                )
    elif top.cause == "no_kv_cache_memory":
        if cpu:
            env["VLLM_CPU_KVCACHE_SPACE"] = "4"
            summary = (
                "The CPU backend was given no memory for the KV cache (VLLM_CPU_KVCACHE_SPACE=0 or "
                "--kv-cache-memory-bytes 0): give it some GiB."
            )
        else:
            kv_auto = str(ctx.arg("kv_cache_dtype") or "auto") == "auto"
            mml = ctx.num("max_model_len")
            if util is None or util < 0.95:
                new_u = min(0.95, round((util or 0.9) + 0.05, 2))
                flags["--gpu-memory-utilization"] = f"{new_u:.2f}"
                summary += f" Raise --gpu-memory-utilization to {new_u:.2f} if nothing else uses the GPU."
            elif kv_auto:
                # the budget is already near the whole card: make each cached token smaller instead
                flags["--kv-cache-dtype"] = "fp8"
                summary += (
                    f" --gpu-memory-utilization is already {util:.2f}: store the KV cache in FP8 "
                    "(--kv-cache-dtype fp8), or run a smaller model or more GPUs."
                )
            if kv_auto and "--kv-cache-dtype" not in flags:
                alts.append(
                    RemedyOption("store the KV cache in FP8 (halves KV memory)", {"--kv-cache-dtype": "fp8"})
                )
            if mml and mml >= 512:
                alts.append(
                    RemedyOption(
                        "a shorter context (smaller profiling run and KV need)",
                        {"--max-model-len": str(round_down_len(int(mml // 2)))},
                    )
                )
            tokens = ctx.num("max_num_batched_tokens")
            new_t = int(tokens // 2) if tokens else 4096
            alts.append(
                RemedyOption(
                    "shrink the profiling run's activation peak", {"--max-num-batched-tokens": str(new_t)}
                )
            )
            if not ctx.arg("enforce_eager"):
                alts.append(
                    RemedyOption(
                        "skip CUDA graphs (their memory is budgeted in recent vLLM)", {"--enforce-eager": ""}
                    )
                )
    elif top.cause == "startup_free_memory_below_target":
        free, total = _f(g, "free_gib"), _f(g, "total_gib")
        if "node" in g and free is not None:
            req = _f(g, "requested_gib")
            space = math.floor(free * 0.8)
            summary = (
                f"The KV cache asked for {req or 0:g} GiB of host RAM but only {free:g} of "
                f"{total or 0:g} GiB was available on NUMA node {g['node']}."
            )
            if space >= 1:
                if ctx.arg("kv_cache_memory_bytes") is not None:
                    flags["--kv-cache-memory-bytes"] = str(space * 2**30)
                else:
                    env["VLLM_CPU_KVCACHE_SPACE"] = str(space)
                summary += f" Ask for {space} GiB or less, or free host memory."
        elif free is not None and total:
            requested = _f(g, "requested_gib")
            summary = (
                f"Only {free:g} of {total:g} GiB was free on the GPU at start-up, less than the "
                f"{requested or 0:g} GiB that gpu_memory_utilization={g.get('util', '?')} asks for: another "
                "process holds GPU memory."
            )
            fit_u = _util_fitting(free, total)
            if fit_u is not None:
                flags["--gpu-memory-utilization"] = f"{fit_u:.2f}"
                summary += f" --gpu-memory-utilization {fit_u:.2f} fits what is free."
        elif "vllm.cumem_oom" in top.sig_ids:
            share = f"{max(0.1, round((util or 0.9) - 0.1, 2)):.2f}"
            flags["--gpu-memory-utilization"] = share
            summary = (
                "vLLM's sleep-mode allocator could not map its memory again (wake_up, or start-up next to "
                "a sleeping server): the weights and KV cache it held before are no larger now, so another "
                "job sharing the GPU holds that memory (the colocated trainer of an RL framework, another "
                "server). Free the other job's memory before wake_up (offload its parameters and optimizer "
                "state, empty its cache), or give this server a smaller share: --gpu-memory-utilization "
                f"{share}."
            )
        elif "others_mib" not in g and (oom := _first_oom_facts(top)) is not None:
            # CUDA ran out of memory while the KV tensors were allocated: the budget vLLM computed from
            # its profile was more than was really free then, so the budget must come down.
            base = util or 0.9
            short = max(0.0, oom.get("tried", 0.0) - oom.get("free", 0.0))  # MiB
            total_m = oom.get("total") or ctx.gpu_total_mib
            step = max(0.05, math.ceil((short + 1024) / total_m * 100) / 100) if total_m else 0.05
            new_u = max(0.1, round(base - step, 2))
            flags["--gpu-memory-utilization"] = f"{new_u:.2f}"
            when = "while vLLM allocated the KV cache" if top.stage == "kv_allocation" else "at start-up"
            summary = (
                f"CUDA ran out of memory {when}: the budget vLLM computed "
                f"(gpu_memory_utilization={base:g}) was more than was free at that moment (memory taken "
                "after profiling by another process, non-PyTorch allocations, or shared/unified memory "
                f"the driver counts differently). Lower --gpu-memory-utilization to {new_u:.2f}."
            )
        elif "others_mib" in g and "total_mib" in g:
            others, total_mib = float(g["others_mib"]), float(g["total_mib"])
            summary = (
                f"Other processes held {others / 1024:.1f} GiB of the GPU's {total_mib / 1024:.1f} GiB when "
                "this one ran out of memory."
            )
            fit_u = _util_fitting((total_mib - others) / 1024, total_mib / 1024)
            if fit_u is not None and ctx.is_vllm:
                flags["--gpu-memory-utilization"] = f"{fit_u:.2f}"
                summary += f" --gpu-memory-utilization {fit_u:.2f} fits the rest."
    elif top.cause == "oom_cudagraph_capture":
        flags["--enforce-eager"] = ""
        summary += " Run without CUDA graphs (--enforce-eager), at some cost in decode speed."
        if util:
            alts.append(
                RemedyOption(
                    "leave room for the graphs", {"--gpu-memory-utilization": f"{max(0.1, util - 0.03):.2f}"}
                )
            )
        seqs = ctx.num("max_num_seqs")
        cap_size = ctx.num("max_cudagraph_capture_size") or (min(2 * seqs, 512) if seqs else 512)
        if _version_at_least(ctx.scan.vllm_version, (0, 11)):
            # vllm/engine/arg_utils.py --max-cudagraph-capture-size (0.11 .. 0.32): the largest batch size
            # captured; vLLM's default is min(2 * max_num_seqs, 512)
            alts.append(
                RemedyOption(
                    "capture fewer, smaller graphs (keeps CUDA graphs for small decode batches)",
                    {"--max-cudagraph-capture-size": str(max(8, int(cap_size // 4)))},
                )
            )
        alts.append(
            RemedyOption(
                "capture graphs for fewer sequences", {"--max-num-seqs": str(int(seqs // 2) if seqs else 128)}
            )
        )
    elif top.cause == "oom_sampler_warmup_or_profile_run":
        n = _f(g, "num_reqs") or ctx.num("max_num_seqs")
        new_seqs = max(1, int(n // 2)) if n else 128
        flags["--max-num-seqs"] = str(new_seqs)
        if "num_reqs" not in g:
            tokens = ctx.num("max_num_batched_tokens")
            flags["--max-num-batched-tokens"] = str(int(tokens // 2) if tokens else 4096)
        summary += " Run the dummy batch smaller: " + " ".join(f"{k} {v}" for k, v in flags.items()) + "."
        if util:
            alts.append(
                RemedyOption(
                    "lower the budget if another process shares the GPU",
                    {"--gpu-memory-utilization": f"{max(0.1, util - 0.05):.2f}"},
                )
            )
    elif top.cause == "oom_runtime_under_load":
        if ctx.is_vllm:
            seqs = ctx.num("max_num_seqs")
            flags["--max-num-seqs"] = str(max(1, int(seqs // 2)) if seqs else 128)
            summary += " Run fewer sequences at once: --max-num-seqs " + str(flags["--max-num-seqs"]) + "."
            if util:
                alts.append(
                    RemedyOption(
                        "leave headroom outside the KV cache",
                        {"--gpu-memory-utilization": f"{max(0.1, util - 0.05):.2f}"},
                    )
                )
            tokens = ctx.num("max_num_batched_tokens")
            chunked = ctx.arg("enable_chunked_prefill")
            v1 = _version_at_least(ctx.scan.vllm_version, (0, 8))
            if chunked in (None, False, "False", "false") and not v1:
                # V0 (vLLM < 0.8) prefills a whole prompt at once unless chunked prefill is on; V1 always
                # chunks (vllm/engine/arg_utils.py --enable-chunked-prefill)
                alts.append(
                    RemedyOption(
                        "split long prompts into chunks (chunked prefill)",
                        {
                            "--enable-chunked-prefill": "",
                            "--max-num-batched-tokens": str(int(tokens // 2) if tokens else 4096),
                        },
                    )
                )
            else:
                alts.append(
                    RemedyOption(
                        "smaller prefill chunks",
                        {"--max-num-batched-tokens": str(int(tokens // 2) if tokens else 4096)},
                    )
                )
    elif top.cause == "oom_weights_do_not_fit":
        summary, flags, alts = _weights_remedy(ctx, top, summary)
    elif top.cause == "host_ram_oom_killed":
        offload = ctx.num("cpu_offload_gb")
        swap = ctx.num("swap_space")
        if offload:
            flags["--cpu-offload-gb"] = str(int(offload // 2)) if offload >= 2 else None
            summary += f" --cpu-offload-gb {offload:g} keeps weights in host RAM: lower it."
        elif swap:
            flags["--swap-space"] = str(int(swap // 2))
            summary += f" --swap-space {swap:g} GiB per GPU is host RAM: lower it."
        elif cpu or "VLLM_CPU_KVCACHE_SPACE" in ctx.env:
            env_space = ctx.env.get("VLLM_CPU_KVCACHE_SPACE", "")
            if env_space.isdigit() and int(env_space) > 1:
                env["VLLM_CPU_KVCACHE_SPACE"] = str(int(env_space) // 2)
                summary += f" The CPU KV cache takes VLLM_CPU_KVCACHE_SPACE={env_space} GiB of RAM: halve it."
    elif top.cause == "host_pinned_memory_swap_space":
        swap_total, cpu_total = _f(g, "swap_gib"), _f(g, "cpu_total_gib")
        cur = ctx.num("swap_space") or 4.0
        if "vllm.v0.swap_space_exhausted" in top.sig_ids:
            new_swap = int(cur * 2)
            host = ctx.plan.get("host_ram_available")
            ranks = int(ctx.num("tensor_parallel_size") or 1)
            summary = (
                f"Preempted sequences' KV blocks did not fit in --swap-space {cur:g} GiB of host RAM per GPU "
                "(V0 engine)."
            )
            if isinstance(host, (int, float)) and host > 0 and new_swap * ranks * 2**30 > 0.35 * host:
                summary += " The host has no room for a larger swap space: run fewer sequences at once."
            else:
                flags["--swap-space"] = str(new_swap)
                summary += f" Use --swap-space {new_swap}, or run fewer sequences at once."
            seqs = ctx.num("max_num_seqs")
            alts.append(
                RemedyOption(
                    "fewer sequences at once (fewer preemptions)",
                    {"--max-num-seqs": str(max(1, int(seqs // 2)) if seqs else 128)},
                )
            )
        elif swap_total and cpu_total:
            gpus = max(1.0, round(swap_total / cur))
            new = int(0.35 * cpu_total / gpus)
            flags["--swap-space"] = str(new)
            summary = (
                f"--swap-space reserves {swap_total:g} GiB of the host's {cpu_total:g} GiB RAM "
                "(more than 70%): "
                f"use --swap-space {new}."
            )
        elif ctx.num("swap_space"):
            flags["--swap-space"] = "0"
    elif top.cause == "quant_or_dtype_unsupported_on_gpu":
        sig_ids = top.sig_ids
        if sig_ids & {"vllm.bf16_unsupported", "vllm.dtype_check_frame"}:
            flags["--dtype"] = "half"
            cap = g.get("capability")
            summary = (
                f"This GPU{' (compute capability ' + cap + ')' if cap else ''} has no bfloat16: "
                "use --dtype half."
            )
        elif sig_ids & {"vllm.quant_min_capability", "vllm.quant_scheme_capability"}:
            method = g.get("method") or str(ctx.arg("quantization") or "")
            summary = (
                f"Quantization {method or '(this method)'} needs compute capability "
                f"{g.get('min_cap', '?')}, the GPU has {g.get('cur_cap', '?')}."
            )
            if method == "fp8" and ctx.arg("quantization") == "fp8":
                flags["--quantization"] = None
                summary += " Drop --quantization fp8 (or use a GPTQ/AWQ checkpoint)."
    elif top.cause == "cuda_driver_runtime_mismatch" and "cuda.system_not_ready" in top.sig_ids:
        summary = (
            "CUDA reports 802 'system not yet initialized': on an NVSwitch system (HGX A100/H100/H200) the "
            "nvidia-fabricmanager service must run, with exactly the driver's version, before any CUDA work "
            "(systemctl status nvidia-fabricmanager; compare its version with nvidia-smi's driver version). "
            "Not a memory problem."
        )
    elif top.cause == "nccl_multi_gpu_comm_failure" and "vllm.custom_allreduce_cuda_error" in top.sig_ids:
        flags["--disable-custom-all-reduce"] = ""
        summary = (
            "vLLM's own all-reduce (csrc/custom_all_reduce.cuh, GPU buffers shared through CUDA IPC and P2P) "
            f"failed with '{g.get('error', 'a CUDA error')}'. --disable-custom-all-reduce makes vLLM use "
            "NCCL for it; check P2P between the GPUs (nvidia-smi topo -p2p r) if NCCL fails too."
        )
    elif top.cause == "config_error_not_resource":
        if "derived" in g:
            derived = int(float(g["derived"]))
            flags["--max-model-len"] = str(derived)
            summary = (
                f"--max-model-len {g.get('max_model_len')} is above the model's own limit "
                f"({g.get('derived_key')}={derived}); use --max-model-len {derived} (or a model/rope "
                "scaling that supports the longer context)."
            )
        elif "batched" in g:
            flags["--max-num-batched-tokens"] = g["max_model_len"]
            summary = (
                f"max_num_batched_tokens ({g['batched']}) is below max_model_len "
                f"({g['max_model_len']}); raise "
                "it or enable chunked prefill."
            )
        elif top.sig_ids & {"hf.trust_remote_code", "hf.trust_remote_code_old"}:
            summary = (
                "The model's repository ships its own Python code, which transformers runs only with "
                "--trust-remote-code. Read that code first: the flag is not added for you."
            )
            alts.append(
                RemedyOption(
                    "after reading the repository's code: --trust-remote-code", {"--trust-remote-code": ""}
                )
            )
        elif top.sig_ids & {"hf.gated", "hf.http_client_error"}:
            summary = (
                "The Hugging Face Hub refused the model download (401/403: no token or no access granted to "
                "a gated repository; 404: wrong name or private repository). Request access on the model "
                "page, then export HF_TOKEN; or pass a local path. Not a memory problem."
            )
        elif top.sig_ids & HUB_RESOLUTION_SIGNATURES:
            model = ctx.arg("model")
            summary = (
                f"The model{' ' + repr(model) if model else ''} could not be resolved: a --model that is "
                "not an existing local directory is looked up as a Hugging Face Hub id, so a mistyped, "
                "relative or unmounted path fails this way, as do a wrong repo name, a missing config.json, "
                "offline mode without a cached copy, or no network. Check that the path exists and holds "
                "config.json and the weights (use an absolute path), or give a valid repo id. "
                "Not a memory problem."
            )
        elif top.sig_ids & {"vllm.tp_above_local_gpus", "vllm.tp_above_available_gpus"}:
            visible = _f(g, "gpus")
            summary = (
                "More tensor-parallel ranks than GPUs this process can see"
                + (f" ({visible:g} visible)" if visible else "")
                + ": check CUDA_VISIBLE_DEVICES and the container's --gpus, or lower --tensor-parallel-size."
            )
            if visible and visible >= 1:
                fit = 1 << (int(visible).bit_length() - 1)  # a power of two divides the attention heads
                flags["--tensor-parallel-size"] = str(fit)
                summary += f" --tensor-parallel-size {fit} fits the GPUs visible."
        elif "vllm.lora_rank_above_max" in top.sig_ids and _f(g, "lora_rank"):
            rank = int(_f(g, "lora_rank") or 0)
            lora_fit = next((r for r in LORA_RANKS if r >= rank), None)
            summary = f"The LoRA adapter's rank ({rank}) is above --max-lora-rank"
            if lora_fit is not None:
                flags["--max-lora-rank"] = str(lora_fit)
                summary += f": --max-lora-rank {lora_fit} (the smallest value vLLM accepts that holds it)"
            summary += ". Not a memory shortage."
        elif "flashinfer.mla_kv_dtype_unsupported" in top.sig_ids:
            flags["--kv-cache-dtype"] = "auto"
            summary = (
                "FlashInfer's MLA kernels refused the KV cache's storage dtype (uint8 is how vLLM stores an "
                "fp8 KV cache): this attention backend and --kv-cache-dtype fp8 do not go together, on any "
                "GPU. --kv-cache-dtype auto keeps the KV cache in the model's dtype (about twice the KV "
                "memory); another MLA backend may take fp8. Not a memory problem."
            )
        elif "vllm.moe_compressed_needs_fp16" in top.sig_ids:
            flags["--dtype"] = "float16"
            summary = (
                "This compressed-tensors MoE checkpoint runs only with float16 activations, whatever the "
                "GPU: use --dtype float16. Not a memory problem."
            )
        elif "vllm.dtype_not_supported_for_quant" in top.sig_ids and g.get("supported"):
            supported = [d.strip().removeprefix("torch.") for d in g["supported"].split(",") if d.strip()]
            method = g.get("method", "this quantization")
            summary = f"{method} runs only in {', '.join(supported)}, not {g.get('dtype', 'this dtype')}"
            if supported:
                pick = "float16" if "float16" in supported else supported[0]
                flags["--dtype"] = pick
                summary += f": --dtype {pick}"
            summary += ". Not a memory problem."
        elif "vllm.gpu_util_above_one" in top.sig_ids:
            given = _f(g, "util_given")
            summary = "--gpu-memory-utilization is a fraction of the GPU's memory, below 1.0"
            if given is not None and 1.0 < given <= 100.0:
                fixed = given / 100.0 if given / 100.0 < 1.0 else 0.9
                flags["--gpu-memory-utilization"] = f"{fixed:.2f}"
                summary += f": {given:g} reads as a percentage, so {fixed:.2f}"
            summary += ". Not a memory shortage."
        elif top.sig_ids & {"vllm.no_device_inferred", "vllm.cuda_visible_devices_empty"}:
            summary = (
                "vLLM found no GPU to run on: the container was started without the GPU (docker --gpus all, "
                "the NVIDIA container runtime, a Kubernetes nvidia.com/gpu limit), CUDA_VISIBLE_DEVICES is "
                "empty, or the driver is not loaded (run nvidia-smi where vLLM runs). Not a memory problem."
            )
        elif top.sig_ids & {"torch.graph_capture_forbidden_call", "cuda.stream_capture_unsupported"}:
            if ctx.scan.engine == "sglang":
                summary = (
                    "The model code makes a call that a CUDA graph cannot record, so the graph capture "
                    "failed: start SGLang with --disable-cuda-graph (slower decoding) or use a release whose "
                    "model code is graph-safe. Not a memory problem."
                )
            else:
                flags["--enforce-eager"] = ""
                summary = (
                    "The model code makes a call that a CUDA graph cannot record, so the graph capture "
                    "failed: run without CUDA graphs (--enforce-eager; decoding gets slower) or use a vLLM "
                    "release whose model code is graph-safe. Not a memory problem."
                )
        elif "net.address_in_use" in top.sig_ids:
            port = ctx.arg("port")
            summary = (
                f"The port{' ' + str(port) if port else ''} is already in use by another process: stop it or "
                "choose another --port. Not a memory problem."
            )
        else:
            texts = [h.text.strip() for h in top.hits]
            # the message as raised, not the frame's source line that holds the same words
            text = next((t for t in texts if not _RAISE_SOURCE.search(t)), texts[0] if texts else "")
            if ctx.is_vllm:
                summary = f"vLLM rejected its configuration: {text[:300]}"
            else:
                # a log with no vLLM in it (a training job, another tool): say what stopped it, not vLLM
                summary = f"The run stopped on its setup, not on a resource: {text[:300]}"
    allowed = _f(g, "allowed_mib")
    if allowed is not None and info.get("memory"):
        # the allocator refused at the process's own limit, not at the card's: that limit comes first
        summary = (
            f"The process may use only {allowed / 1024:.2f} GiB of the GPU (torch.cuda."
            "set_per_process_memory_fraction, or a server's --cuda-memory-fraction) and ran out of that "
            f"budget: raise the limit, or make the run need less. {summary}"
        )
    if _engine(ctx, top) != "vllm":
        summary, flags, env, alts = _other_engine(ctx, top, summary, flags, env, alts)
        # the cause's generic alternatives name vLLM's options; another server's log keeps only the others
        base_alts = [a for a in base_alts if "--" not in a.summary]
    # a generic alternative that names an option a computed one already changes says the same thing twice
    proposed = {flag for a in alts for flag in a.flag_changes} | set(flags)
    base_alts = [a for a in base_alts if not any(flag in a.summary for flag in proposed)]
    return Remediation(
        summary=summary.strip(), flag_changes=flags, env_changes=env, alternatives=tuple(alts + base_alts)
    )


ENGINE_NAMES = {
    "tgi": "text-generation-inference",
    "sglang": "SGLang",
    "lmdeploy": "LMDeploy",
    "turbomind": "LMDeploy (TurboMind)",
    "lightllm": "LightLLM",
    "exllamav2": "ExLlamaV2",
}


def _engine(ctx: _Context, top: _Candidate) -> str:
    """The server that wrote the log: its own lines say so, or the message of the diagnosis does."""
    if ctx.scan.engine != "vllm":
        return ctx.scan.engine
    for sid in top.sig_ids:
        prefix = sid.split(".", 1)[0]
        if prefix in ENGINE_NAMES:
            return prefix
    return "vllm"


def _other_engine(
    ctx: _Context,
    top: _Candidate,
    summary: str,
    flags: dict[str, str | None],
    env: dict[str, str],
    alts: list[RemedyOption],
) -> tuple[str, dict[str, str | None], dict[str, str], list[RemedyOption]]:
    """A log from another server: its own options where its message names them, never vLLM's flags."""
    g = top.groups
    engine = _engine(ctx, top)
    name = ENGINE_NAMES.get(engine, engine)
    if "tgi.warmup_not_enough_memory" in top.sig_ids and _f(g, "prefill_tokens"):
        tokens = int(_f(g, "prefill_tokens") or 0)
        new: dict[str, str | None] = {"--max-batch-prefill-tokens": str(max(1, tokens // 2))}
        return (
            f"{name}'s warm-up could not run a batch of {tokens} prefill tokens: "
            f"use --max-batch-prefill-tokens {tokens // 2} (or a smaller --max-input-tokens).",
            new,
            {},
            [],
        )
    if "sglang.not_enough_memory" in top.sig_ids or "sglang.weights_leave_no_kv" in top.sig_ids:
        cur = _f(g, "mem_fraction")
        floor = _f(g, "suggested_fraction")  # SGLang's own minimum for these weights
        text = (
            f"{name} found no room for its KV pool after the weights: raise --mem-fraction-static"
            + (f" above {cur:g}" if cur else "")
            + " (a larger static share), or use a quantized model / more GPUs (--tp)."
        )
        fraction: dict[str, str | None] = {}
        if floor is not None and floor < 0.95:
            # a little above SGLang's floor: the KV pool needs room of its own
            fraction["--mem-fraction-static"] = f"{min(0.95, math.ceil((floor + 0.02) * 100) / 100):.2f}"
            text += f" {name} computed the floor for these weights: {floor:g}."
        elif cur and cur < 0.95:
            fraction["--mem-fraction-static"] = f"{min(0.95, cur + 0.05):.2f}"
        return text, fraction, {}, []
    if engine == "tgi" and top.cause == "oom_sampler_warmup_or_profile_run":
        return (
            f"{name}'s warm-up (its profiling run) ran out of GPU memory: lower --max-batch-prefill-tokens "
            "(and --max-input-tokens / --max-total-tokens), or shard over more GPUs (--num-shard).",
            {},
            {},
            [],
        )
    if engine in ("lmdeploy", "turbomind") and top.cause == "no_kv_cache_memory":
        return (
            f"{name} found no room for its KV cache after the weights: shard the model over more GPUs "
            "(--tp), serve a 4-bit AWQ/GPTQ checkpoint (--model-format awq), or lower --session-len and "
            "--max-batch-size; --cache-max-entry-count is the share of the memory left after the weights "
            "that the cache may take.",
            {},
            {},
            [],
        )
    if "exllamav2.job_exceeds_cache" in top.sig_ids:
        cache_tokens = _f(g, "cache_tokens")
        return (
            f"{name}'s cache holds "
            + (f"{cache_tokens:.0f} tokens" if cache_tokens else "fewer tokens than this request needs")
            + " in all, and one request (its prompt and max_new_tokens) needs more pages than that: "
            "allocate a larger cache (TabbyAPI cache_size, exllamav2's cache max_seq_len; the quantized "
            "cache_mode Q4/Q6/Q8 fits more tokens in the same memory), or cap max_seq_len at the cache size "
            "so such a request is refused up front.",
            {},
            {},
            [],
        )
    if engine == "exllamav2" and top.cause == "kv_cache_too_small_for_max_model_len":
        return (
            f"{name} sizes its cache for max_seq_len tokens (the model's whole context when none is given), "
            "and that cache did not fit beside the weights: give a shorter max_seq_len (TabbyAPI "
            "max_seq_len / --max-seq-len, exllamav2's -l, text-generation-webui's max_seq_len), use the "
            "quantized cache (cache_mode Q4/Q6/Q8, -cq4), or a lower-bpw quant of the model.",
            {},
            {},
            [],
        )
    if engine == "lightllm" and top.cause == "no_kv_cache_memory":
        return (
            f"{name} allocates its KV pool at start-up for --max_total_token_num tokens, and the pool did "
            "not fit beside the weights: lower --max_total_token_num (each token needs 2 x layers x KV heads "
            "x head size x 2 bytes), or shard over more GPUs (--tp).",
            {},
            {},
            [],
        )
    kept = [a for a in alts if not a.flag_changes and not a.env_changes]
    note = f" This log is from {name}: the vLLM options above do not apply as they are; use its equivalents."
    return summary + (note if flags or env or len(kept) != len(alts) else ""), {}, {}, kept


# --------------------------------------------------------------------------------------------------
# entry points
# --------------------------------------------------------------------------------------------------
def diagnose(
    path: Path,
    telemetry: Path | None = None,
    dmesg: Path | None = None,
    exit_code: int | None = None,
    lexicon: triage_lexicon.Lexicon | None = None,
) -> Diagnosis:
    """Diagnose a run directory from `gputune launch` (its last attempt) or a log file.

    ``lexicon``: the word counts for logs no signature explains (default: the shipped
    playbooks/triage/lexicon.tsv); the corpus tests and benchmarks pass one trained without the case's
    own set. Raises UsageError when a path is missing or unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory", "give a run directory or a vLLM log file")
    try:
        files = locate_run(path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from exc
    for opt, p in (("--telemetry", telemetry), ("--dmesg", dmesg)):
        if p is not None and not Path(p).is_file():
            raise UsageError(f"{opt} {p}: no such file")
    pb = playbook()
    if files.log is None:
        raise UsageError(f"{path}: no log found (expected vllm.log or a *.log file)")
    try:
        with files.log.open("rb") as fh:
            res = scan(fh, "log", pb)
    except OSError as exc:
        raise UsageError(f"{files.log}: cannot read it ({exc.strerror})") from exc

    kernel = None
    kpath = Path(dmesg) if dmesg else files.dmesg
    if kpath is not None:
        try:
            with kpath.open("rb") as fh:
                kernel = scan(fh, "kernel", pb)
        except OSError as exc:
            raise UsageError(f"{kpath}: cannot read it ({exc.strerror})") from exc

    exit_doc = read_json(files.exit_json)
    code = exit_code if exit_code is not None else exit_from_json(exit_doc)
    cmd = read_json(files.command_json)
    argv = [str(a) for a in cmd.get("argv", [])] if isinstance(cmd.get("argv"), list) else []
    env = {str(k): str(v) for k, v in cmd.get("env", {}).items()} if isinstance(cmd.get("env"), dict) else {}

    tel = None
    tpath = Path(telemetry) if telemetry else files.telemetry
    if tpath is not None:
        try:
            tel = read_telemetry(tpath)
        except OSError as exc:
            raise UsageError(f"{tpath}: cannot read it ({exc.strerror})") from exc
        except (ValueError, IndexError, StopIteration):
            tel = None

    others, total = _other_gpu_memory(files.gpu_processes, res, cmd)
    total = total or (tel.total_mib if tel else None) or _total_from_log(res)
    plan = read_json(files.plan_json) if files.plan_json else {}
    ctx = _Context(res, pb, argv, env, code, tel, others, total, kernel, plan)
    ranked = _weigh(ctx, _gather(ctx))
    if not ranked or ranked[0].confidence < MIN_CONFIDENCE:
        lexical = _lexical_candidate(ctx, ranked, lexicon)
        if lexical is not None:
            ranked = [lexical, *ranked]
    return _build(ctx, ranked, files.log, files.attempt)


def _lexical_candidate(
    ctx: _Context, ranked: list[_Candidate], lexicon: triage_lexicon.Lexicon | None
) -> _Candidate | None:
    """When no signature names a cause: the cause the words of the failure lines point to
    (tuner/triage_lexicon.py), never a memory cause; not when a memory message was set aside (an OOM line
    of a card with room to spare stays unknown), nor when the log was cut inside a traceback."""
    memory = {c for c, info in ctx.pb.causes.items() if info.get("memory")}
    if any(c.cause in memory for c in ranked) or not ctx.scan.lines:
        return None
    if _ends_inside_traceback(ctx.scan) is not None:
        return None  # cut before the line that names the error: _build says so
    allowed = [c for c, info in ctx.pb.causes.items() if not info.get("memory") and c != UNKNOWN]
    reading = triage_lexicon.read(ctx.scan, allowed, lexicon)
    if reading is None:
        return None
    cand = _Candidate(reading.cause, triage_lexicon.LEXICON_CONFIDENCE, stage=ctx.scan.stage, reading=reading)
    words = ", ".join(reading.words)
    for no, text, line_words in reading.lines:
        detail = "its words weigh for the cause: " + ", ".join(line_words)
        cand.extra.append(Evidence("log", text, no, detail))
    cand.extra.append(
        Evidence(
            "log",
            f"no signature matched; the words of the failure lines ({words}) point to {reading.cause} "
            f"(posterior {reading.posterior:.2f} over {reading.cases} labelled real failures)",
            None,
            triage_lexicon.SOURCE,
        )
    )
    return cand


def _total_from_log(res: ScanResult) -> float | None:
    """The GPU's capacity in MiB as PyTorch's OOM message states it ('total capacity of 139.80 GiB')."""
    for hit in res.hits:
        if hit.signature.cause == "oom":
            total = _torch_oom_facts(hit.text).get("total")
            if total:
                return total
    return None


def _other_gpu_memory(
    path: Path | None, res: ScanResult, cmd: dict[str, Any]
) -> tuple[float | None, float | None]:
    """MiB that processes other than this run's held on the GPU (the most seen at any time)."""
    if path is None:
        return None, None
    try:
        rows = read_gpu_processes(path)
    except OSError:
        return None, None
    if not rows:
        return 0.0, None
    own = set(res.pids)
    for key in ("pid", "child_pid"):
        if isinstance(cmd.get(key), int):
            own.add(int(cmd[key]))
    first_time = rows[0][0]
    if not own:
        # without this run's pids, the processes present in the first sample were there before it
        before = {s.pid for t, s in rows if t == first_time}
        by_time: dict[str, float] = {}
        for t, s in rows:
            if s.pid in before:
                by_time[t] = by_time.get(t, 0.0) + s.used_mib
        return (max(by_time.values()) if by_time else 0.0), None
    by_time = {}
    for t, s in rows:
        if s.pid not in own:
            by_time[t] = by_time.get(t, 0.0) + s.used_mib
    return (max(by_time.values()) if by_time else 0.0), None


_RAISE_SOURCE = re.compile(r"(?:^|\s)raise \w+(?:\.\w+)*\(")

CUT_TRACEBACK_HINT = 0.2  # an alternative only: the stage's usual failure, never the answer


# Lines that announce a traceback: Python's own header, and vLLM's worker wrappers that print one
# before the frames (vllm/executor/multiproc_worker_utils.py 'Exception in worker X while processing
# method M', worker_base.py 'Error executing method M.', v1 multiproc_executor.py / core.py 'WorkerProc
# hit an exception.' / 'EngineCore hit an exception')
_TRACEBACK_OPENER = re.compile(
    r"Traceback \(most recent call last\):\s*$"
    r"|Exception in worker \S+ while processing method \w+[.:]?\s*$"
    r"|Error executing method \w+\..*$"
    r"|hit an exception[.:]?(?: %s)?\s*$"
)


def _ends_inside_traceback(res: ScanResult) -> tuple[int, str] | None:
    """The last frame (or traceback header) when the log stops inside a traceback: frames not followed
    by an exception line (ScanResult.recent_frames is cleared by every exception line), or a header
    with nothing after it, within the last lines of the log."""
    if not res.tail:
        return None
    last = res.tail[-1][0]
    if res.recent_frames and last - res.recent_frames[-1][0] <= 3:
        return res.recent_frames[-1]
    for no, text in res.tail[-3:]:
        if _TRACEBACK_OPENER.search(text):
            return no, text.strip()[:300]
    return None


def _build(ctx: _Context, ranked: list[Any], log: Path | None, attempt: str | None) -> Diagnosis:
    pb = ctx.pb
    res = ctx.scan
    if not ranked or ranked[0].confidence < MIN_CONFIDENCE:
        info = pb.causes.get(UNKNOWN, {})
        ev = [
            Evidence("log", text, no, "last error line")
            for no, text in res.tail
            if any(w in text for w in ("Error", "ERROR", "error:", "Traceback", "Killed", "exit"))
        ][-5:]
        if ctx.exit_code is not None:
            ev.append(Evidence("exit", f"exit status {ctx.exit_code}"))
        summary = str(info.get("summary", ""))
        alternatives = [(c.cause, round(c.confidence, 2)) for c in ranked[:3]]
        # what set a known message aside (the OOM line of a card with room to spare): say so
        weak = [e for c in ranked[:3] for e in c.extra if e.kind == "log" and e.line is not None]
        if weak:
            ev.extend(weak[:2])
            summary = (
                "Known messages were found, but none names a cause with enough confidence: "
                + "; ".join(e.text for e in weak[:2])
                + "."
            )
        cut_at = _ends_inside_traceback(res)
        if res.bytes == 0 or not res.lines:
            summary = (
                "The log is empty, so there is nothing to triage: the process may have died before it wrote "
                "anything (check the exit status and the kernel log), or its output went elsewhere "
                "(docker logs, journalctl -u, a supervisor's own log file)."
            )
            what = "the log is empty (0 bytes)" if res.bytes == 0 else "the log has no lines"
            ev.append(Evidence("log", what))
        elif cut_at is not None:
            # Python prints the exception line after the frames: a log that stops after frames was cut
            # (a paste, a truncated file, a collector's line limit) before the line that names the cause
            ev.append(Evidence("log", cut_at[1], cut_at[0], "the log ends inside this traceback"))
            summary = (
                "The log ends inside a traceback, before its exception line, so the cause is not in it"
                + (f" (start-up had reached stage '{res.stage}')" if res.stage != "unknown" else "")
                + ". Triage the complete log: the line after the frames names the error."
            )
            usual = ctx.pb.oom_by_stage.get(res.stage) if res.stage != "unknown" else None
            if usual and all(c != usual for c, _ in alternatives):
                alternatives.append((usual, CUT_TRACEBACK_HINT))
        return Diagnosis(
            cause=UNKNOWN,
            confidence=0.0,
            evidence=tuple(ev),
            stage=res.stage,
            remediation=Remediation(
                summary,
                alternatives=tuple(RemedyOption(str(a)) for a in info.get("alternatives", [])),
            ),
            alternatives=tuple(alternatives),
            fixable_by_args=False,
            title=str(info.get("title", "")),
            vllm_version=res.vllm_version,
            log=str(log) if log else None,
        )
    top = ranked[0]
    info = pb.causes.get(top.cause, {})
    evidence: list[Evidence] = []
    seen: set[tuple[bool, int]] = set()
    for hit in sorted(top.hits, key=lambda h: (h.line_no, -h.signature.weight)):
        in_kernel = bool(ctx.kernel and hit in ctx.kernel.hits)
        key = (in_kernel, hit.line_no)
        if key in seen or len(seen) >= 6:
            continue
        seen.add(key)
        kind = "kernel" if in_kernel else "log"
        count = (ctx.kernel.hit_counts if kind == "kernel" and ctx.kernel else res.hit_counts).get(
            hit.signature.id, 1
        )
        detail = f"{hit.signature.id}: {hit.signature.source}"
        if count > 1:
            detail += f" (seen {count} times)"
        evidence.append(Evidence(kind, hit.text.strip()[:500], hit.line_no, detail))
    for ev in top.extra:  # several signatures can read one line: each explanation is listed once
        _add_once(evidence, ev)
    stage = top.stage if top.stage != "unknown" else res.stage
    if stage in res.stage_first_line:
        evidence.append(
            Evidence(
                "log",
                f"start-up reached stage '{stage}'",
                res.stage_first_line[stage],
                "first landmark of that stage (playbooks/triage/stages.toml)",
            )
        )
    if ctx.exit_code is not None and not any(e.kind == "exit" for e in evidence):
        evidence.append(Evidence("exit", f"exit status {ctx.exit_code}"))
    remedy = _remedy(ctx, top)
    return Diagnosis(
        cause=top.cause,
        confidence=round(min(0.99, top.confidence), 2),
        evidence=tuple(evidence),
        stage=stage,
        remediation=remedy,
        alternatives=tuple((c.cause, round(c.confidence, 2)) for c in ranked[1:4]),
        # a cause read from words alone proposes no argument, so `launch --auto-fix` stops on it
        fixable_by_args=top.reading is None
        and (bool(info.get("fixable_by_args", False)) or any(h.signature.fixable_by_args for h in top.hits)),
        title=str(info.get("title", "")),
        memory=bool(info.get("memory", False)),
        source=top.hits[0].signature.source if top.hits else (triage_lexicon.SOURCE if top.reading else ""),
        vllm_version=res.vllm_version,
        log=str(log) if log else None,
    )


def apply_flag_changes(args: list[str], changes: dict[str, str | None]) -> list[str]:
    """Apply triage's flag changes to a vLLM argument list.

    ``changes`` maps a flag to its new value; ``""`` means a bare boolean flag (added once), ``None``
    removes the flag. Both ``--flag value`` and ``--flag=value`` are understood, ``--max_model_len``
    is the same flag as ``--max-model-len``, and since argparse lets the last occurrence win, the
    last one is rewritten in place and earlier ones are dropped.
    """
    out = list(args)
    for flag, value in changes.items():
        norm = flag.replace("_", "-")
        spans: list[tuple[int, int]] = []  # [start, end) of each occurrence
        i = 0
        while i < len(out):
            tok = out[i]
            name = tok.split("=", 1)[0].replace("_", "-")
            if tok.startswith("--") and name == norm:
                if "=" in tok:
                    spans.append((i, i + 1))
                elif i + 1 < len(out) and not (out[i + 1].startswith("--") or out[i + 1] == "-"):
                    spans.append((i, i + 2) if value != "" else (i, i + 1))
                    i += 1 if value == "" else 2
                    continue
                else:
                    spans.append((i, i + 1))
            i += 1
        if value is None:
            for start, end in reversed(spans):
                del out[start:end]
            continue
        replacement = [flag] if value == "" else [flag, value]
        if spans:
            last_start, last_end = spans[-1]
            out[last_start:last_end] = replacement
            for start, end in reversed(spans[:-1]):
                del out[start:end]
        else:
            out.extend(replacement)
    return out


def main(
    path: Path,
    telemetry: Path | None = None,
    dmesg: Path | None = None,
    exit_code: int | None = None,
    fmt: str = "table",
) -> int:
    """`gputune triage`: print the diagnosis; 0 cause found, 1 unknown, 2 usage, 3 broke."""
    try:
        diag = diagnose(Path(path), telemetry, dmesg, exit_code)
    except UsageError as exc:
        print(f"gputune: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"  hint: {exc.hint}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except Exception as exc:
        if os.environ.get("GPUTUNE_DEBUG"):
            raise
        print(f"gputune: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return int(ExitCode.INTERNAL)
    if fmt == "json":
        print(json.dumps(diag.to_dict(), indent=2))
    else:
        from tuner.triage_render import render_table

        render_table(diag)
    return int(ExitCode.OK if diag.cause != UNKNOWN else ExitCode.BAD_ANSWER)

"""Rules for ``memory.*`` (definitions in checks/memory.toml; facts from tuner/probes/memory.py)."""

from __future__ import annotations

from collections.abc import Iterator

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.probes import Facts
from tuner.probes.memory import UNLIMITED, MemoryFacts, fmt_bytes

SHM_MIN = 1 << 30  # below 1 GiB, multi-process vLLM and NCCL run out of shared memory
SWAPPINESS_MAX = 10


@rule("memory.shm")
def memory_shm(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    mf: MemoryFacts = facts.get("memory")
    ev = {
        "size": mf.shm_size,
        "size_human": fmt_bytes(mf.shm_size),
        "free": mf.shm_free,
        "source": mf.shm_source or None,
    }
    if mf.shm_size is None:
        if mf.shm_reason == "nothing is mounted on /dev/shm":
            yield check.finding(
                Status.WARN, "nothing is mounted on /dev/shm", {**ev, "reason": mf.shm_reason}, "grow"
            )
        else:
            yield check.finding(
                Status.SKIP, f"/dev/shm size unknown: {mf.shm_reason}", {**ev, "reason": mf.shm_reason}
            )
        return
    if mf.shm_size < SHM_MIN:
        yield check.finding(
            Status.WARN,
            f"/dev/shm is only {fmt_bytes(mf.shm_size)}: tensor parallelism and NCCL may die of bus errors",
            ev,
            "grow",
        )
        return
    yield check.finding(Status.PASS, f"/dev/shm holds {fmt_bytes(mf.shm_size)}", ev)


@rule("memory.memlock")
def memory_memlock(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    mf: MemoryFacts = facts.get("memory")
    ev = {
        "soft": mf.memlock_soft,
        "hard": mf.memlock_hard,
        "soft_human": fmt_bytes(mf.memlock_soft),
        "source": mf.memlock_source or None,
        "rdma_devices": list(mf.rdma_devices),
    }
    if mf.memlock_soft is None:
        yield check.finding(Status.SKIP, "the locked-memory limit is unknown (no /proc/self/limits)", ev)
        return
    if mf.memlock_soft == UNLIMITED:
        yield check.finding(Status.PASS, "locked memory is unlimited", ev)
        return
    limit = fmt_bytes(mf.memlock_soft)
    if mf.rdma_devices:
        yield check.finding(
            Status.WARN,
            f"locked memory is limited to {limit} and RDMA devices ({', '.join(mf.rdma_devices)}) exist:"
            " NCCL over InfiniBand/RoCE and GPUDirect need it unlimited",
            ev,
            "raise",
        )
        return
    yield check.finding(
        Status.PASS,
        f"locked memory is limited to {limit}; no RDMA devices, and CUDA pinned memory is not counted",
        ev,
    )


@rule("memory.cgroup")
def memory_cgroup(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    mf: MemoryFacts = facts.get("memory")
    ev = {
        "cgroup_version": mf.cgroup_version,
        "cgroup": mf.cgroup_path,
        "limit": mf.cgroup_limit,
        "limit_human": fmt_bytes(mf.cgroup_limit) if mf.cgroup_limit is not None else None,
        "file": mf.cgroup_limit_file,
        "mem_total": mf.mem_total,
    }
    if mf.cgroup_reason:
        yield check.finding(Status.SKIP, f"cgroup memory limit unknown: {mf.cgroup_reason}", ev)
        return
    if mf.cgroup_limit is None:
        yield check.finding(Status.PASS, f"no cgroup memory limit (cgroup v{mf.cgroup_version})", ev)
        return
    if mf.mem_total is not None and mf.cgroup_limit < mf.mem_total:
        limit = fmt_bytes(mf.cgroup_limit)
        yield check.finding(
            Status.WARN,
            f"this cgroup may use {limit} of {fmt_bytes(mf.mem_total)} RAM: the kernel kills vLLM at {limit}",
            ev,
            "raise",
            limit=limit,
            file=mf.cgroup_limit_file or "memory.max",
        )
        return
    yield check.finding(Status.PASS, f"cgroup memory limit {fmt_bytes(mf.cgroup_limit)} is not below RAM", ev)


@rule("memory.thp")
def memory_thp(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    mf: MemoryFacts = facts.get("memory")
    ev = {"enabled": mf.thp_enabled, "defrag": mf.thp_defrag}
    if mf.thp_enabled is None:
        yield check.finding(Status.SKIP, "transparent hugepages are not reported", ev)
        return
    if mf.thp_enabled == "always" and mf.thp_defrag == "always":
        yield check.finding(
            Status.WARN,
            "THP enabled=always with defrag=always: large allocations stall in direct compaction",
            ev,
            "madvise",
        )
        return
    defrag = f", defrag={mf.thp_defrag}" if mf.thp_defrag else ""
    yield check.finding(Status.PASS, f"THP enabled={mf.thp_enabled}{defrag}", ev)


@rule("memory.swappiness")
def memory_swappiness(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    mf: MemoryFacts = facts.get("memory")
    has_swap = bool(mf.swap_total)
    ev = {"swappiness": mf.swappiness, "overcommit_memory": mf.overcommit_memory, "swap_total": mf.swap_total}
    if mf.swappiness is None and mf.overcommit_memory is None:
        yield check.finding(Status.SKIP, "vm.swappiness and vm.overcommit_memory are not readable", ev)
        return
    if mf.overcommit_memory == 2:
        yield check.finding(
            Status.WARN,
            "vm.overcommit_memory=2 (strict): large CUDA/PyTorch reservations can fail while RAM is free",
            ev,
            "overcommit",
        )
        return
    if has_swap and mf.swappiness is not None and mf.swappiness > SWAPPINESS_MAX:
        yield check.finding(
            Status.WARN,
            f"vm.swappiness={mf.swappiness} with swap present: the kernel swaps out working memory early",
            ev,
            "swappiness",
        )
        return
    why = "" if has_swap else " (no swap, so swappiness does not matter)"
    yield check.finding(
        Status.PASS, f"vm.swappiness={mf.swappiness}, vm.overcommit_memory={mf.overcommit_memory}{why}", ev
    )

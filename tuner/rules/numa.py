"""Rule for ``numa.affinity`` (definition in checks/numa.toml; facts from tuner/probes/numa.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.probes import Facts
from tuner.probes.memory import fmt_bytes
from tuner.probes.numa import (
    GpuNuma,
    NumaFacts,
    format_cpulist,
    launch_node,
    node_of_cpus,
    numactl_argv,
)


def _gpu_label(g: GpuNuma) -> str:
    return f"gpu{g.index}" if g.index is not None else g.pci_bus_id


def evidence(nf: NumaFacts) -> dict[str, Any]:
    node = launch_node(nf)
    return {
        "nodes": [
            {
                "id": n.id,
                "cpus": n.cpulist,
                "mem_total": n.mem_total,
                "mem_total_human": fmt_bytes(n.mem_total),
                "mem_free": n.mem_free,
                "mem_free_human": fmt_bytes(n.mem_free),
                "mem_available": n.mem_available,
                "mem_available_human": fmt_bytes(n.mem_available),
            }
            for n in nf.nodes
        ],
        "gpus": [
            {
                "pci_bus_id": g.pci_bus_id,
                "index": g.index,
                "name": g.name,
                "numa_node": g.node,
                "numa_node_source": g.node_source,
                "local_cpus": g.local_cpulist,
            }
            for g in nf.gpus
        ],
        "gpus_found_through": nf.gpu_source,
        "process_cpus": format_cpulist(nf.process_cpus) if nf.process_cpus is not None else None,
        "process_cpus_source": nf.process_cpus_source or None,
        "numa_balancing": nf.balancing,
        "launch_binding": " ".join(numactl_argv(node)) if node is not None else None,
    }


@rule("numa.affinity")
def numa_affinity(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    nf: NumaFacts = facts.get("numa")
    ev = evidence(nf)
    if not nf.nodes:
        yield check.finding(Status.SKIP, f"NUMA topology not reported: {nf.nodes_reason}", ev)
        return
    if not nf.multi_node:
        with_cpus = [n for n in nf.nodes if n.cpus]
        if not with_cpus:
            what = f"{len(nf.nodes)} NUMA node(s) whose CPUs are not reported (no nodeN/cpulist)"
        elif len(nf.nodes) == 1:
            what = f"one NUMA node (node {with_cpus[0].id}, CPUs {with_cpus[0].cpulist})"
        else:
            first = with_cpus[0]
            what = f"one NUMA node with CPUs (node {first.id}, CPUs {first.cpulist}), the others memory-only"
        yield check.finding(Status.SKIP, f"{what}: binding does not matter here", ev)
        return
    if not nf.gpus:
        node = launch_node(nf)
        where = f"; launch would bind to node {node} (most free memory)" if node is not None else ""
        yield check.finding(
            Status.SKIP, f"{len(nf.nodes)} NUMA nodes but no NVIDIA GPU to bind next to{where}", ev
        )
        return
    proc = set(nf.process_cpus) if nf.process_cpus is not None else None
    by_id = {n.id: n for n in nf.nodes}
    for g in nf.gpus:
        subject = _gpu_label(g)
        if g.node is None or g.node not in by_id:
            yield check.finding(
                Status.SKIP,
                f"{subject} ({g.pci_bus_id}): the firmware does not report its NUMA node (numa_node -1)"
                + (f"; its local CPUs are {g.local_cpulist}" if g.local_cpulist else ""),
                ev,
                "unknown_node",
                subject=subject,
            )
            continue
        gnode = by_id[g.node]
        local = set(g.local_cpus or gnode.cpus)
        if proc is None:
            yield check.finding(
                Status.WARN,
                f"{subject} is on node {g.node} (CPUs {gnode.cpulist}); this process's CPU affinity"
                " is unknown, so bind explicitly",
                ev,
                "bind",
                subject=subject,
                node=g.node,
            )
            continue
        if not proc <= local:
            spans = sorted(node_of_cpus(nf, proc))
            extra = "; automatic NUMA balancing is also on" if nf.balancing == 1 else ""
            yield check.finding(
                Status.WARN,
                f"{subject} is on node {g.node} (CPUs {gnode.cpulist}) but this process may run on CPUs"
                f" {format_cpulist(proc)} (nodes {', '.join(map(str, spans)) or '?'}): not bound to the GPU's"
                f" node{extra}",
                ev,
                "bind",
                subject=subject,
                node=g.node,
            )
            continue
        if nf.balancing == 1:
            yield check.finding(
                Status.WARN,
                f"bound to node {g.node} next to {subject}, but automatic NUMA balancing is on and migrates"
                " pages behind the binding",
                ev,
                "balancing",
                subject=subject,
            )
            continue
        yield check.finding(
            Status.PASS,
            f"bound to node {g.node} (CPUs {gnode.cpulist}), {subject}'s node",
            ev,
            subject=subject,
        )

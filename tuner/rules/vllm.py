"""Rule for ``vllm.exposed`` (definition in checks/vllm.toml; facts from tuner/probes/net.py)."""

from __future__ import annotations

from collections.abc import Iterator

from tuner.checks import CheckDef, rule
from tuner.findings import Finding, Status
from tuner.probes import Facts
from tuner.probes.net import VLLM_PORTS, Listener, NetFacts


def _addr(ln: Listener) -> str:
    return f"[{ln.address}]:{ln.port}" if ln.family == 6 else f"{ln.address}:{ln.port}"


@rule("vllm.exposed")
def vllm_exposed(facts: Facts, check: CheckDef) -> Iterator[Finding]:
    nf: NetFacts = facts.get("net")
    exposed = [ln for ln in nf.listeners if not ln.loopback]
    ev_base = {
        "exposed_listeners": sorted({_addr(ln) for ln in exposed}),
        "processes_scanned": nf.processes_scanned,
    }
    if nf.reason:
        yield check.finding(Status.SKIP, f"listening sockets unknown: {nf.reason}", ev_base)
        return
    found = False
    owned: set[int] = set()
    for s in nf.servers:
        owned.update(ln.inode for ln in s.listeners)
        if not s.listeners:
            continue
        found = True
        where = ", ".join(_addr(ln) for ln in s.listeners)
        ev = {
            **ev_base,
            "pid": s.pid,
            "argv": list(s.argv),
            "listens_on": where,
            "api_key_argument": s.api_key_arg,
            "vllm_api_key_env": s.api_key_env,
        }
        subject = f"pid {s.pid}"
        if s.api_key_arg or s.api_key_env:
            yield check.finding(
                Status.PASS,
                f"vLLM (pid {s.pid}) listens on {where} and requires an API key",
                ev,
                subject=subject,
            )
        elif s.api_key_env is None:
            yield check.finding(
                Status.WARN,
                f"vLLM (pid {s.pid}) listens on {where} without --api-key; its environment (VLLM_API_KEY)"
                " is unreadable",
                ev,
                "protect",
                subject=subject,
            )
        else:
            yield check.finding(
                Status.FAIL,
                f"vLLM (pid {s.pid}) listens on {where} without an API key: anyone on the network can use it",
                ev,
                "protect",
                subject=subject,
            )
    if not nf.processes_scanned:
        for ln in exposed:
            if ln.port in VLLM_PORTS and ln.inode not in owned:
                found = True
                yield check.finding(
                    Status.WARN,
                    f"something listens on {_addr(ln)} (a port vLLM uses); the process is unknown here",
                    ev_base,
                    "identify",
                    subject=_addr(ln),
                    address=ln.address,
                    port=ln.port,
                )
    if not found:
        yield check.finding(Status.PASS, "no vLLM server listens on a non-loopback address", ev_base)

"""TCP listeners, and the vLLM servers behind them (for the ``vllm.exposed`` check).

Sources (all through the host root):
- ``/proc/net/tcp`` and ``/proc/net/tcp6``: sockets in state 0A (LISTEN), their local address,
  port and inode;
- live host only: ``/proc/PID/cmdline`` of every process (is it a vLLM server? was it given
  ``--api-key``?), ``/proc/PID/fd/*`` links ``socket:[INODE]`` (which listener is it?),
  ``/proc/PID/environ`` (``VLLM_API_KEY`` set?; readable only for our own user or as root).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.host import Host

if TYPE_CHECKING:
    from tuner.probes import Facts

# Ports vLLM deployments use: its default 8000 and neighbours, and the usual proxy-facing ones.
VLLM_PORTS = frozenset({8000, 8001, 8002, 8003, 8080, 8888, 9000})
_LISTEN = "0A"
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """Whether an address or name reaches only this machine: 127.0.0.0/8, ::1, ::ffff:127.x and the
    standard loopback names; ``0.0.0.0``, ``::`` and other names do not."""
    h = host.strip().strip("[]")
    if h.lower() in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


@dataclass(frozen=True)
class Listener:
    address: str  # "0.0.0.0", "::", "10.0.0.5" (from the hex local_address)
    port: int
    inode: int  # socket inode, matches /proc/PID/fd/N -> socket:[inode]
    family: int  # 4 or 6

    @property
    def loopback(self) -> bool:
        return is_loopback(self.address)


@dataclass(frozen=True)
class VllmServer:
    pid: int
    argv: tuple[str, ...]  # /proc/PID/cmdline, secrets redacted
    listeners: tuple[Listener, ...]  # its listening sockets
    api_key_arg: bool  # --api-key on the command line
    api_key_env: bool | None  # VLLM_API_KEY in /proc/PID/environ; None = environ unreadable


@dataclass(frozen=True)
class NetFacts:
    listeners: tuple[Listener, ...]
    reason: str  # why /proc/net/tcp could not be read, "" when it was
    servers: tuple[VllmServer, ...]  # vLLM servers found through /proc (live host only)
    processes_scanned: bool  # whether /proc/PID was searched (live host)


# -- pure parsers -------------------------------------------------------------------------------
def _hex_address(hexaddr: str) -> tuple[str, int]:
    """``0100007F`` (v4) / 32 hex digits (v6), in the kernel's per-32-bit-word host order."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) not in (4, 16):
        raise ValueError(f"bad address {hexaddr!r}")
    # each 32-bit word is printed in host (little-endian) order
    fixed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(fixed) == 4:
        return str(ipaddress.IPv4Address(fixed)), 4
    return str(ipaddress.IPv6Address(fixed)), 6


def parse_proc_net_tcp(text: str) -> list[Listener]:
    """Listening sockets of /proc/net/tcp or tcp6. Lines that do not parse are left out."""
    out: list[Listener] = []
    for line in text.splitlines()[1:]:
        if f" {_LISTEN} " not in line:  # most sockets are connections; skip them before splitting
            continue
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        addr_hex, _, port_hex = fields[1].partition(":")
        try:
            address, family = _hex_address(addr_hex)
            port, inode = int(port_hex, 16), int(fields[9])
        except ValueError:
            continue
        out.append(Listener(address, port, inode, family))
    return out


def is_vllm_server(argv: list[str]) -> bool:
    """``vllm serve ...``, ``python -m vllm.entrypoints.openai.api_server``, and the like."""
    if not argv:
        return False
    joined = " ".join(argv[:6])
    if "vllm.entrypoints" in joined:
        return True
    prog = argv[0].rsplit("/", 1)[-1]
    if prog == "vllm" and len(argv) > 1 and argv[1] == "serve":
        return True
    # python /path/bin/vllm serve ...
    return any(
        a.rsplit("/", 1)[-1] == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve"
        for i, a in enumerate(argv[:4])
    )


def redact_argv(argv: list[str]) -> tuple[str, ...]:
    """Hide secrets: the value after --api-key (or in --api-key=...) and --hf-token."""
    out: list[str] = []
    hide_next = False
    for a in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        key = a.split("=", 1)[0]
        if key in ("--api-key", "--hf-token", "--token"):
            if "=" in a:
                out.append(f"{key}=<redacted>")
            else:
                out.append(a)
                hide_next = True
            continue
        out.append(a)
    return tuple(out)


# -- reading ------------------------------------------------------------------------------------
def _socket_inodes(host: Host, pid: str) -> set[int]:
    inodes: set[int] = set()
    fds = host.listdir(f"/proc/{pid}/fd")
    for fd in fds.value or []:
        target = host.readlink(f"/proc/{pid}/fd/{fd}") or ""
        if target.startswith("socket:[") and target.endswith("]"):
            try:
                inodes.add(int(target[8:-1]))
            except ValueError:
                continue
    return inodes


def _servers(host: Host, listeners: list[Listener]) -> list[VllmServer]:
    by_inode = {ln.inode: ln for ln in listeners}
    servers: list[VllmServer] = []
    for pid in host.listdir("/proc").value or []:
        if not pid.isdigit():
            continue
        cmd = host.read_text(f"/proc/{pid}/cmdline", limit=256 << 10)
        if not cmd.ok or not cmd.value:
            continue
        argv = [a for a in cmd.value.split("\0") if a]
        if not is_vllm_server(argv):
            continue
        mine = tuple(by_inode[i] for i in sorted(_socket_inodes(host, pid)) if i in by_inode)
        env = host.read_text(f"/proc/{pid}/environ", limit=1 << 20)
        api_env: bool | None = None
        if env.ok and env.value is not None:
            api_env = any(
                e.startswith("VLLM_API_KEY=") and len(e) > len("VLLM_API_KEY=") for e in env.value.split("\0")
            )
        has_arg = any(a == "--api-key" or a.startswith("--api-key=") for a in argv)
        servers.append(VllmServer(int(pid), redact_argv(argv), mine, has_arg, api_env))
    return servers


def probe(facts: Facts) -> NetFacts:
    host = facts.host
    listeners: list[Listener] = []
    reasons: list[str] = []
    for name in ("tcp", "tcp6"):
        r = host.read_text(f"/proc/net/{name}", limit=64 << 20)
        if r.ok and r.value is not None:
            listeners.extend(parse_proc_net_tcp(r.value))
        elif name == "tcp":
            reasons.append(r.reason or "/proc/net/tcp unreadable")
    exposed = [ln for ln in listeners if not ln.loopback]
    servers = _servers(host, exposed) if host.live and exposed else []
    return NetFacts(tuple(listeners), "; ".join(reasons), tuple(servers), host.live and bool(exposed))

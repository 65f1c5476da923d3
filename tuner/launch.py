"""`gputune launch`: doctor, plan, and vLLM under numactl, supervised and recorded.

The flow, in order (each step recorded in the run directory, see :mod:`tuner.rundir`):

1. plan (:func:`tuner.plan.build_plan`): vLLM arguments with a reason each, the user's extra
   arguments after ``--`` merged and winning;
2. refuse a non-loopback bind without an API key unless ``--allow-unauthenticated``; the key reaches
   vLLM only through ``VLLM_API_KEY`` (an ``--api-key`` among the extra arguments is moved there)
   and is ``***`` in every record;
3. ``--dry-run`` stops here, printing the plan and the command;
4. the doctor (:mod:`tuner.checks`): failures of checks that break serving stop the launch unless
   ``--force``; then the port must be free (a bind test) and host RAM must cover
   ``--cpu-offload-gb``;
5. ``numactl --cpunodebind=N --membind=N <python> -m vllm.entrypoints.openai.api_server ...`` in a
   session of its own, with N the GPU's NUMA node (CPU backend: the node with the most free memory);
   unbound, and saying so, when the node is unknown or numactl is missing. vLLM writes straight
   into ``vllm.log`` (unbuffered), so its output survives any crash of gputune;
6. readiness: ``/health`` polled every 0.1 s, and at once when the log says "Application startup
   complete", then ``/v1/models``; a death before that is recorded (exit.json, dmesg tail), and
   with ``--auto-fix N`` diagnosed by :mod:`tuner.triage` and relaunched with its argument changes,
   up to N times;
7. once ready: the endpoint on stdout, a short smoke load (TTFT, tokens/s), then supervision with
   telemetry (NVML, /metrics, warnings) until Ctrl-C/SIGTERM, which stops vLLM's whole process
   tree (SIGTERM to its group, SIGKILL after a timeout) and checks that nothing of it is left,
   on the GPU included.

Exit codes: 0 served and stopped on request; 1 refused, died, or never became ready; 2 usage.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuner.errors import BadAnswer, ExitCode, UsageError
from tuner.probes.net import is_loopback
from tuner.rundir import (
    COMMAND,
    DMESG,
    DOCTOR,
    EXIT,
    PLAN,
    REDACTED,
    SMOKE,
    VLLM_LOG,
    RunDir,
    default_run_dir,
    redact,
    utc_now_iso,
    write_text_atomic,
)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
READY_LINE = b"Application startup complete"
# Failures of these checks break serving (a link trained at x1, a driver older than the CUDA runtime,
# another process holding the GPU, swap on a slow disk); other failures are reported, not blocking.
BLOCKING_CHECKS = (
    "pcie.link",
    "driver.cuda",
    "gpu.processes",
    "gpu.ecc",
    "gpu.compute_capability",
    "kernel.xid",
    "swap.device",
    "memory.shm",
)
POLL_S = 0.1  # /health poll period while starting
STOP_TIMEOUT_S = 30.0  # graceful stop before SIGKILL
LOG_TAIL_LINES = 25


class PlanLike(Protocol):
    """What launch reads of :class:`tuner.plan.Plan`."""

    @property
    def feasible(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def model_name(self) -> str: ...
    @property
    def vllm_args(self) -> Sequence[str]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def warnings(self) -> Sequence[str]: ...
    @property
    def numa_node(self) -> int | None: ...
    @property
    def numa_reason(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


Planner = Callable[..., PlanLike]
Doctor = Callable[[], list[dict[str, Any]]]


def say(message: str) -> None:
    """A message for the person (stderr; stdout carries data only)."""
    print(f"gputune: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# argument helpers (pure)
# ----------------------------------------------------------------------------------------------
def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag`` (``--flag V`` or ``--flag=V``) in ``args``; None when absent."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def remove_flag(args: Sequence[str], flag: str) -> list[str]:
    """``args`` without any ``flag`` and its value."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == flag:
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def connect_host(host: str) -> str:
    """Where to reach a server bound to ``host`` from this machine."""
    h = host.strip().strip("[]")
    if h in ("", "0.0.0.0"):
        return "127.0.0.1"
    if h == "::":
        return "::1"
    return h


def base_url(host: str, port: int) -> str:
    h = connect_host(host)
    return f"http://[{h}]:{port}" if ":" in h else f"http://{h}:{port}"


def port_problem(host: str, port: int) -> str | None:
    """Why vLLM could not bind ``host:port`` (in use, address not here), or None when it can.

    Binds with SO_REUSEADDR as uvicorn does, so a port left in TIME_WAIT is free.
    """
    bind_host = host.strip().strip("[]") or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve --host {host!r}: {exc.strerror}"
    for family, socktype, proto, _, addr in infos[:1]:
        s = socket.socket(family, socktype, proto)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                who = _port_owner(port)
                return f"port {port} on {host} is already in use{who}"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"address {host} is not an address of this machine"
            if exc.errno == errno.EACCES:
                return f"port {port} needs privileges to bind (ports below 1024 are reserved)"
            return f"cannot bind {host}:{port}: {exc.strerror}"
        finally:
            s.close()
    return None


def _port_owner(port: int) -> str:
    try:
        import psutil

        for c in psutil.net_connections(kind="inet"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                try:
                    name = psutil.Process(c.pid).name()
                except psutil.Error:
                    name = "?"
                return f" (pid {c.pid}, {name})"
    except Exception:  # not root, or psutil cannot list sockets here
        return ""
    return ""


def offload_gib(args: Sequence[str]) -> float | None:
    """Host RAM that ``--cpu-offload-gb`` takes in all: vLLM's value is per GPU (times the TP size)."""
    v = flag_value(args, "--cpu-offload-gb")
    tp = flag_value(args, "--tensor-parallel-size") or flag_value(args, "-tp") or "1"
    if v is None:
        return None
    try:
        return float(v) * max(1, int(tp))
    except ValueError:
        return None


def shell_line(argv: Sequence[str], env: Mapping[str, str]) -> str:
    pre = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (pre + " " if pre else "") + shlex.join(argv)


# ----------------------------------------------------------------------------------------------
# process tree
# ----------------------------------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _libc() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _child_setup() -> None:
    """In the child before exec: die (SIGTERM) with gputune, even if gputune is SIGKILLed."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def become_subreaper() -> bool:
    """Orphans of vLLM's tree re-parent to us rather than init, so a stop finds every one of them."""
    if _LIBC is None or not sys.platform.startswith("linux"):
        return False
    return bool(_LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


@dataclass
class StopReport:
    pids: list[int]  # the tree as found when the stop began
    graceful: bool  # every process left after SIGTERM, before the timeout
    killed: list[int]  # pids that needed SIGKILL
    left: list[int]  # pids still alive at the end (should be empty)
    seconds: float
    gpu_holders: list[int] = field(default_factory=list)  # tree pids still in NVML's process lists

    def to_dict(self) -> dict[str, Any]:
        return {
            "pids": self.pids,
            "graceful": self.graceful,
            "killed": self.killed,
            "left": self.left,
            "seconds": round(self.seconds, 3),
            "gpu_holders": self.gpu_holders,
        }


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants (psutil)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [pid] + [c.pid for c in p.children(recursive=True)]
    except psutil.Error:
        return []


def group_pids(pgid: int) -> list[int]:
    """Processes of process group ``pgid``: they outlive a dead leader (vLLM's engine after its
    API server died) and are no longer its descendants then."""
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


def stop_process_tree(
    proc: subprocess.Popen[bytes] | int, timeout: float = STOP_TIMEOUT_S, extra: Sequence[int] = ()
) -> StopReport:
    """SIGTERM to the process group of ``proc`` (and each descendant), SIGKILL after ``timeout``.

    ``proc`` leads its own session (started with ``start_new_session``), so its group holds the
    tree; descendants that left the group are found through psutil (recursively) and ``extra``.
    """
    import psutil

    t0 = time.monotonic()
    pid = proc if isinstance(proc, int) else proc.pid
    popen_pid = None if isinstance(proc, int) else pid
    procs: dict[int, psutil.Process] = {}
    for p in [pid, *tree_pids(pid), *group_pids(pid), *extra]:
        with contextlib.suppress(psutil.Error):
            procs[p] = psutil.Process(p)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for p in list(procs.values()):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    deadline = t0 + timeout
    # Grandchildren may spawn while the tree shuts down: look again until the tree is gone.
    while time.monotonic() < deadline:
        _reap(proc)
        for c in [*tree_pids(pid), *group_pids(pid)]:
            if c not in procs:
                with contextlib.suppress(psutil.Error):
                    procs[c] = psutil.Process(c)
                    procs[c].send_signal(signal.SIGTERM)
        if not _alive(procs.values(), popen_pid):
            break
        time.sleep(0.05)
    survivors = _alive(procs.values(), popen_pid)
    killed = [p.pid for p in survivors]
    if survivors:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        for p in survivors:
            with contextlib.suppress(psutil.Error):
                p.kill()
        end = time.monotonic() + 5.0
        while time.monotonic() < end and _alive(procs.values(), popen_pid):
            _reap(proc)
            time.sleep(0.05)
    _reap(proc)
    left = [p.pid for p in _alive(procs.values(), popen_pid)]
    return StopReport(sorted(procs), not killed, killed, left, time.monotonic() - t0)


def _alive(procs: Any, popen_pid: int | None = None) -> list[Any]:
    """Processes still running; zombies we are the parent of (as subreaper) are reaped, except the
    Popen's own child, whose status Popen must collect itself."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
            elif p.is_running() and p.pid != popen_pid:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(p.pid, os.WNOHANG)  # our zombie (subreaper): reap it
        except psutil.Error:
            continue
    return out


def _reap(proc: subprocess.Popen[bytes] | int) -> None:
    if isinstance(proc, subprocess.Popen):
        proc.poll()


def signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


# ----------------------------------------------------------------------------------------------
# HTTP (stdlib only)
# ----------------------------------------------------------------------------------------------
def http_get(url: str, timeout: float = 1.0, api_key: str | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        return int(exc.code), b""
    except (OSError, ValueError, http.client.HTTPException):
        return 0, b""


def served_model(body: bytes) -> str | None:
    """The first model id of a /v1/models answer."""
    try:
        data = json.loads(body)
        return str(data["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def stream_completion(
    host: str, port: int, model: str, prompt: str, max_tokens: int, api_key: str | None, timeout: float = 60.0
) -> dict[str, Any]:
    """One streaming /v1/completions request: time to first token, tokens, tokens/s."""
    conn = http.client.HTTPConnection(connect_host(host), port, timeout=timeout)
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,  # vLLM extension: a random tiny model must still produce max_tokens
            "stream_options": {"include_usage": True},
            "temperature": 0.0,
        }
    )
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    t0 = time.monotonic()
    first: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    try:
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            return {"ok": False, "status": resp.status, "error": resp.read(2000).decode(errors="replace")}
        while True:
            raw = resp.readline()
            if not raw:
                break
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                msg = json.loads(payload)
            except ValueError:
                continue
            if msg.get("choices") and any(c.get("text") for c in msg["choices"]):
                chunks += 1
                if first is None:
                    first = time.monotonic()
            if isinstance(msg.get("usage"), dict) and msg["usage"].get("completion_tokens") is not None:
                usage_tokens = int(msg["usage"]["completion_tokens"])
    except (OSError, http.client.HTTPException) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        conn.close()
    end = time.monotonic()
    tokens = usage_tokens if usage_tokens is not None else chunks
    seconds = end - t0
    return {
        "ok": first is not None,
        "ttft_s": round(first - t0, 4) if first is not None else None,
        "tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
        "decode_tokens_per_s": (
            round((tokens - 1) / (end - first), 2)
            if first is not None and tokens > 1 and end > first
            else None
        ),
    }


def smoke_load(
    host: str, port: int, model: str, api_key: str | None, requests: int = 3, max_tokens: int = 16
) -> dict[str, Any]:
    """A few streaming completions, one after another; medians of TTFT and tokens/s."""
    results = [
        stream_completion(host, port, model, "The quick brown fox", max_tokens, api_key)
        for _ in range(requests)
    ]
    good = [r for r in results if r.get("ok")]

    def median(key: str) -> float | None:
        vals = sorted(float(r[key]) for r in good if r.get(key) is not None)
        return vals[len(vals) // 2] if vals else None

    return {
        "model": model,
        "max_tokens": max_tokens,
        "requests": results,
        "ok": len(good) == len(results),
        "ttft_s_median": median("ttft_s"),
        "tokens_per_s_median": median("tokens_per_s"),
    }


# ----------------------------------------------------------------------------------------------
# doctor
# ----------------------------------------------------------------------------------------------
def live_doctor() -> list[dict[str, Any]]:
    """Every shipped check on this host, as Finding.to_dict() records."""
    from tuner.checks import load_defs, run_checks
    from tuner.host import Host
    from tuner.probes import Facts

    return [f.to_dict() for f in run_checks(Facts(Host.live_host()), load_defs())]


def blocking_findings(findings: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        f
        for f in findings
        if f.get("status") == "fail"
        and any(f.get("id") == b or str(f.get("id", "")).startswith(b + ".") for b in BLOCKING_CHECKS)
    ]


# ----------------------------------------------------------------------------------------------
# the launch
# ----------------------------------------------------------------------------------------------
@dataclass
class Options:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allow_unauthenticated: bool = False
    run_dir: Path | None = None
    force: bool = False
    dry_run: bool = False
    auto_fix: int = 0
    telemetry_interval: float = 1.0
    ready_timeout: float = 900.0
    smoke: bool = True
    exit_when_ready: bool = False
    stop_timeout: float = STOP_TIMEOUT_S


@dataclass
class Command:
    """The command of one attempt, before it runs."""

    argv: list[str]
    vllm_args: list[str]
    env_changes: dict[str, str]  # what we add to/override in our environment (secrets included)
    numa_node: int | None
    numa_bound: bool
    numa_reason: str

    def record(self, attempt: int) -> dict[str, Any]:
        return {
            "argv": self.argv,
            "cwd": os.getcwd(),
            "env": {
                **{k: (REDACTED if k == "VLLM_API_KEY" else v) for k, v in self.env_changes.items()},
                "PYTHONUNBUFFERED": "1",
            },
            "numa": {"node": self.numa_node, "bound": self.numa_bound, "reason": self.numa_reason},
            "attempt": attempt,
            "started_at": utc_now_iso(),
            "python": sys.executable,
        }


@dataclass
class Outcome:
    state: str  # stopped | died_startup | died_serving | timeout | interrupted
    returncode: int | None
    reason: str


class _Stop:
    """Signal handlers for the launch: they only set a flag; the main loop does the stopping."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old[s] = signal.signal(s, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        self.event.set()

    def restore(self) -> None:
        for s, h in self._old.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(s, h)
        self._old.clear()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "stop"


def build_command(
    plan: PlanLike,
    vllm_args: Sequence[str],
    extra_env: Mapping[str, str],
    server_cmd: Sequence[str] | None = None,
    numactl: str | None = None,
) -> Command:
    """numactl prefix (when a node is known and numactl exists) + the server + its arguments."""
    server = list(server_cmd) if server_cmd else [sys.executable, "-m", SERVER_MODULE]
    node = plan.numa_node
    prefix: list[str] = []
    bound = False
    if node is None:
        reason = plan.numa_reason or "no NUMA node is known for this launch"
        reason = f"launching unbound: {reason}"
    elif numactl is None:
        reason = f"launching unbound: numactl is not installed (wanted node {node}: {plan.numa_reason})"
    else:
        try:
            from tuner.probes.numa import numactl_argv

            prefix = numactl_argv(node)
        except ImportError:
            prefix = ["numactl", f"--cpunodebind={node}", f"--membind={node}"]
        prefix[0] = numactl
        bound = True
        reason = plan.numa_reason or f"bound to NUMA node {node}"
    return Command(prefix + server + list(vllm_args), list(vllm_args), dict(extra_env), node, bound, reason)


class Launch:
    """One `gputune launch`: its attempts, records and the supervision of the running server."""

    def __init__(
        self,
        plan: PlanLike,
        opts: Options,
        run: RunDir,
        api_key: str | None,
        server_cmd: Sequence[str] | None = None,
        started_mono: float | None = None,
        stop: _Stop | None = None,
    ) -> None:
        self.plan = plan
        self.opts = opts
        self.run = run
        self.api_key = api_key
        self.server_cmd = server_cmd
        self.started_mono = started_mono if started_mono is not None else time.monotonic()
        self.stop = stop or _Stop()
        self.numactl = shutil.which("numactl")
        self._subreaper = become_subreaper()

    # -- one attempt ----------------------------------------------------------------------------
    def attempt(self, n: int, vllm_args: list[str], env_changes: dict[str, str]) -> Outcome:
        from tuner.telemetry import Recorder, dmesg_reader

        run, opts = self.run, self.opts
        adir = run.attempt(n)
        cmd = build_command(self.plan, vllm_args, env_changes, self.server_cmd, self.numactl)
        run.write_json(COMMAND, cmd.record(n), attempt=n)
        if n > 1:
            plan_d = dict(self.plan.to_dict())
            plan_d["vllm_args"] = list(vllm_args)
            plan_d["env"] = {k: v for k, v in env_changes.items() if k != "VLLM_API_KEY"}
            plan_d["auto_fix_attempt"] = n
            run.write_json(PLAN, plan_d, attempt=n)
        if not cmd.numa_bound:
            run.event("numa", cmd.numa_reason, node=cmd.numa_node)
            say(cmd.numa_reason)
        env = dict(os.environ)
        env.update(env_changes)
        env["PYTHONUNBUFFERED"] = "1"  # vLLM's log reaches the file line by line
        host = flag_value(vllm_args, "--host") or opts.host
        port = int(flag_value(vllm_args, "--port") or opts.port)
        log_path = adir / VLLM_LOG
        if self.stop.event.is_set():
            return self._interrupted_before_start(n)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            proc = subprocess.Popen(
                cmd.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_child_setup,
                close_fds=True,
            )
        except OSError as exc:
            os.close(log_fd)
            msg = f"could not start {cmd.argv[0]}: {exc.strerror or exc}"
            run.event("exit", msg, attempt=n)
            self._write_exit(n, None, "startup", msg)
            say(msg)
            return Outcome("died_startup", None, msg)
        os.close(log_fd)
        now = time.monotonic()
        run.event(
            "exec",
            f"started vLLM (pid {proc.pid}), attempt {n}",
            pid=proc.pid,
            attempt=n,
            argv=cmd.argv,
            overhead_s=round(now - self.started_mono, 4),
            exec_mono=now,
            gputune_start_mono=self.started_mono,
        )
        say(f"vLLM starting (pid {proc.pid}, attempt {n}); log: {log_path}")
        recorder = Recorder(
            adir,
            events=run.events,
            interval=opts.telemetry_interval,
            kernel_log=dmesg_reader(),
        )
        recorder.start()
        try:
            return self._supervise(n, proc, host, port, log_path, recorder)
        except BaseException as exc:  # gputune broke while vLLM runs: never leave the tree behind
            if proc.poll() is None:
                self._stop_tree(n, proc, "interrupted", f"gputune stopped: {type(exc).__name__}: {exc}")
            raise
        finally:
            recorder.stop()

    def _interrupted_before_start(self, n: int) -> Outcome:
        msg = f"interrupted by {self.stop.name} before vLLM started"
        self._write_exit(n, None, "interrupted", msg)
        self.run.event("interrupted", msg)
        return Outcome("interrupted", None, msg)

    def _supervise(
        self, n: int, proc: subprocess.Popen[bytes], host: str, port: int, log_path: Path, recorder: Any
    ) -> Outcome:
        run, opts = self.run, self.opts
        url = base_url(host, port)
        wake = threading.Event()
        seen: dict[str, float] = {}
        watcher_stop = threading.Event()
        watcher = threading.Thread(
            target=_watch_log, args=(log_path, wake, seen, watcher_stop), name="gputune-log", daemon=True
        )
        watcher.start()
        deadline = time.monotonic() + opts.ready_timeout
        model: str | None = None
        reported_line = False
        try:
            while True:
                if self.stop.event.is_set():
                    return self._stop_tree(
                        n, proc, "interrupted", f"interrupted by {self.stop.name} before ready"
                    )
                if "line" in seen and not reported_line:
                    reported_line = True
                    run.event(
                        "startup_complete_seen",
                        "vLLM logged 'Application startup complete'",
                        mono=seen["line"],
                    )
                rc = proc.poll()
                if rc is not None:
                    return self._died(n, proc, "startup", recorder)
                if time.monotonic() > deadline:
                    return self._stop_tree(
                        n, proc, "startup", f"not ready after {opts.ready_timeout:g} s", state="timeout"
                    )
                status, _ = http_get(url + "/health", timeout=1.0)
                if status == 200:
                    status, body = http_get(url + "/v1/models", timeout=2.0, api_key=self.api_key)
                    if status == 200:
                        model = served_model(body)
                        break
                wake.wait(POLL_S)
                wake.clear()
            ready_mono = time.monotonic()
            # /health can answer a moment before the log line lands in the file: let the watcher see it
            end = ready_mono + 0.25
            while "line" not in seen and time.monotonic() < end and watcher.is_alive():
                time.sleep(0.01)
        finally:
            watcher_stop.set()
        line_mono = seen.get("line")
        if line_mono is not None and not reported_line:
            run.event("startup_complete_seen", "vLLM logged 'Application startup complete'", mono=line_mono)
        run.event(
            "ready",
            f"vLLM serves on {url}/v1",
            url=url + "/v1",
            model=model,
            attempt=n,
            mono=ready_mono,
            startup_complete_mono=line_mono,
            ready_delay_s=round(ready_mono - line_mono, 4) if line_mono is not None else None,
            since_gputune_start_s=round(ready_mono - self.started_mono, 3),
        )
        print(f"{url}/v1", flush=True)
        say(f"ready: {url}/v1 (model {model}); Ctrl-C stops it")
        recorder.watch_metrics(url + "/metrics")
        if opts.smoke and model:
            result = smoke_load(host, port, model, self.api_key)
            run.write_json(SMOKE, result)
            run.event(
                "smoke",
                f"smoke load: TTFT {result['ttft_s_median']} s, {result['tokens_per_s_median']} tokens/s",
                ok=result["ok"],
                ttft_s=result["ttft_s_median"],
                tokens_per_s=result["tokens_per_s_median"],
            )
            say(
                f"smoke load: {len(result['requests'])} requests, TTFT {result['ttft_s_median']} s,"
                f" {result['tokens_per_s_median']} tokens/s"
            )
        if opts.exit_when_ready:
            return self._stop_tree(
                n, proc, "stopped", "stopped after ready (--exit-when-ready)", state="stopped"
            )
        while True:
            if self.stop.event.wait(0.5):
                return self._stop_tree(n, proc, "stopped", f"stopped by {self.stop.name}", state="stopped")
            if proc.poll() is not None:
                return self._died(n, proc, "serving", recorder)

    # -- endings --------------------------------------------------------------------------------
    def _stop_tree(
        self, n: int, proc: subprocess.Popen[bytes], stage: str, reason: str, state: str = "interrupted"
    ) -> Outcome:
        say(f"{reason}: stopping vLLM's process tree")
        report = stop_process_tree(proc, self.opts.stop_timeout)
        report.gpu_holders = _gpu_holders(report.pids)
        rc = proc.returncode
        self.run.event(
            "stop",
            f"{reason}; vLLM's tree stopped"
            + ("" if report.graceful else f" (SIGKILL for {report.killed})")
            + (f"; LEFT RUNNING: {report.left}" if report.left else "")
            + (f"; still on the GPU: {report.gpu_holders}" if report.gpu_holders else ""),
            attempt=n,
            returncode=rc,
            **report.to_dict(),
        )
        if report.left or report.gpu_holders:
            say(f"warning: processes of vLLM's tree are still alive: {report.left or report.gpu_holders}")
        self._write_exit(n, rc, stage, reason)
        if state == "interrupted":
            self.run.event("interrupted", reason, attempt=n)
        return Outcome(state, rc, reason)

    def _died(self, n: int, proc: subprocess.Popen[bytes], stage: str, recorder: Any) -> Outcome:
        rc = proc.returncode
        sig = signal_name(rc)
        # The server is gone; anything it left behind (engine, workers) goes too.
        report = stop_process_tree(proc, 5.0)
        reason = f"vLLM exited with {sig or f'status {rc}'} during {stage}"
        self._capture_dmesg(n)
        self._write_exit(n, rc, stage, reason)
        self.run.event(
            "exit",
            reason,
            attempt=n,
            returncode=rc,
            signal=sig,
            stage=stage,
            leftovers=[p for p in report.pids if p != proc.pid],  # stopped with it
            left_running=report.left,
        )
        say(reason)
        tail = _log_tail(self.run.attempt(n) / VLLM_LOG, LOG_TAIL_LINES)
        if tail:
            print("".join("  | " + line + "\n" for line in tail), file=sys.stderr, end="", flush=True)
        return Outcome("died_" + stage, rc, reason)

    def _capture_dmesg(self, n: int) -> None:
        from tuner.host import Host
        from tuner.probes.kernel import read_kernel_log  # dmesg, else journalctl -k

        log, _ = read_kernel_log(Host.live_host())
        if log.ok and log.value:
            lines = log.value.splitlines()[-400:]
            write_text_atomic(self.run.attempt(n) / DMESG, "\n".join(lines) + "\n")
        else:
            self.run.event("dmesg", f"kernel log not readable: {log.reason[:200]}", attempt=n)

    def _write_exit(self, n: int, rc: int | None, stage: str, reason: str) -> None:
        self.run.write_json(
            EXIT,
            {
                "returncode": rc,
                "signal": signal_name(rc),
                "ended_at": utc_now_iso(),
                "reason": reason,
                "stage": stage,
                "attempt": n,
            },
            attempt=n,
        )

    # -- attempts and auto-fix --------------------------------------------------------------------
    def run_all(self, vllm_args: list[str], env_changes: dict[str, str]) -> int:
        n = 1
        while True:
            out = self.attempt(n, vllm_args, env_changes)
            if out.state == "stopped":
                return int(ExitCode.OK)
            if out.state in ("interrupted", "timeout", "died_serving"):
                return int(ExitCode.BAD_ANSWER)
            diag = self._diagnose(n, out)
            if diag is None:
                say(f"see {self.run.path} (`gputune triage {self.run.path}`)")
                return int(ExitCode.BAD_ANSWER)
            changes = _flag_changes(diag)
            env_fix = _env_changes(diag)
            if n > self.opts.auto_fix:
                if changes or env_fix:
                    say(
                        "next arguments to try: "
                        + ", ".join(f"{k} {v}" if v else k for k, v in changes.items())
                        + ("" if self.opts.auto_fix else " (or run again with --auto-fix 1)")
                    )
                return int(ExitCode.BAD_ANSWER)
            if not getattr(diag, "fixable_by_args", False) or not (changes or env_fix):
                say("arguments cannot fix this; not relaunching")
                return int(ExitCode.BAD_ANSWER)
            from tuner.triage import apply_flag_changes

            vllm_args = list(apply_flag_changes(list(vllm_args), changes))
            env_changes = {**env_changes, **env_fix}
            self.run.event(
                "relaunch",
                f"auto-fix: relaunching with {changes or env_fix} (attempt {n + 1})",
                attempt=n + 1,
                flag_changes=changes,
                env_changes=env_fix,
                vllm_args=vllm_args,
            )
            say(
                f"auto-fix: relaunching with {changes or env_fix}"
                f" (attempt {n + 1} of {self.opts.auto_fix + 1})"
            )
            n += 1

    def _diagnose(self, n: int, out: Outcome) -> Any:
        try:
            from tuner.triage import diagnose
        except ImportError:
            return None
        adir = self.run.attempt(n)
        tele = adir / "telemetry.csv"
        dmesg = adir / DMESG
        try:
            diag = diagnose(
                adir,
                telemetry=tele if tele.exists() else None,
                dmesg=dmesg if dmesg.exists() else None,
                exit_code=out.returncode,
            )
        except Exception as exc:  # triage broke: the launch result stands, say so
            self.run.event("diagnosis", f"triage failed: {type(exc).__name__}: {exc}", attempt=n)
            return None
        data = diag.to_dict() if hasattr(diag, "to_dict") else {"cause": getattr(diag, "cause", None)}
        self.run.event("diagnosis", f"triage: {getattr(diag, 'cause', '?')}", attempt=n, diagnosis=data)
        summary = ""
        rem = getattr(diag, "remediation", None)
        if rem is not None:
            summary = getattr(rem, "summary", "") or ""
        say(
            f"triage: {getattr(diag, 'cause', '?')} (confidence {getattr(diag, 'confidence', '?')},"
            f" stage {getattr(diag, 'stage', '?')})" + (f": {summary}" if summary else "")
        )
        return diag


def _flag_changes(diag: Any) -> dict[str, str | None]:
    rem = getattr(diag, "remediation", None)
    changes = getattr(rem, "flag_changes", None) if rem is not None else None
    return dict(changes) if isinstance(changes, Mapping) else {}


def _env_changes(diag: Any) -> dict[str, str]:
    rem = getattr(diag, "remediation", None)
    changes = getattr(rem, "env_changes", None) if rem is not None else None
    return {str(k): str(v) for k, v in changes.items()} if isinstance(changes, Mapping) else {}


def _watch_log(path: Path, wake: threading.Event, seen: dict[str, float], stop: threading.Event) -> None:
    """Follow vLLM's log for the startup line; note when it appeared and wake the ready loop."""
    pos = 0
    carry = b""
    while not stop.is_set():
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                data = fh.read()
        except OSError:
            data = b""
        if data:
            pos += len(data)
            buf = carry + data
            if READY_LINE in buf:
                seen["line"] = time.monotonic()
                wake.set()
                return
            carry = buf[-len(READY_LINE) :]
        stop.wait(0.02)


def _log_tail(path: Path, lines: int) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _gpu_holders(pids: Sequence[int]) -> list[int]:
    """Pids of the stopped tree that NVML still lists on a GPU (waits up to 5 s for the driver)."""
    if not pids:
        return []
    try:
        from tuner.gpu import NvmlSampler
    except ImportError:
        return []
    sampler = NvmlSampler(slow_every=0.0)
    if not sampler.open():
        return []
    want = set(pids)
    end = time.monotonic() + 5.0
    holders: list[int] = []
    while True:
        samples = sampler.sample(time.time(), time.monotonic())
        holders = sorted({p.pid for s in samples for p in (s.processes or ()) if p.pid in want})
        if not holders or time.monotonic() > end:
            return holders
        time.sleep(0.2)


# ----------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------
def _default_planner(**kwargs: Any) -> PlanLike:
    from tuner.plan import PlanRequest, build_plan

    return build_plan(PlanRequest(**kwargs))


def prepare_args(plan: PlanLike, api_key: str | None) -> tuple[list[str], str | None]:
    """The plan's arguments with any ``--api-key`` moved out (it goes through the environment)."""
    args = list(plan.vllm_args)
    in_args = flag_value(args, "--api-key") or getattr(plan, "api_key_in_extras", None)
    args = remove_flag(args, "--api-key")
    return args, api_key or in_args


def env_for(plan: PlanLike, vllm_args: Sequence[str], api_key: str | None) -> dict[str, str]:
    """Environment changes for vLLM: the plan's (never over a value the user set) and the key."""
    env: dict[str, str] = {}
    for k, v in (plan.env or {}).items():
        if k in os.environ:
            continue  # the user's environment wins over the plan
        # vLLM's CPU backend lets VLLM_CPU_KVCACHE_SPACE override --kv-cache-memory-bytes:
        # a size the user gave on the command line wins over the plan's variable.
        if k == "VLLM_CPU_KVCACHE_SPACE" and flag_value(vllm_args, "--kv-cache-memory-bytes") is not None:
            continue
        env[k] = str(v)
    if api_key:
        env["VLLM_API_KEY"] = api_key
    return env


def main(
    model: str,
    gpu_mem: str | None = None,
    gpus: int | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    allow_unauthenticated: bool = False,
    run_dir: Path | None = None,
    force: bool = False,
    dry_run: bool = False,
    auto_fix: int = 0,
    telemetry_interval: float = 1.0,
    ready_timeout: float = 900.0,
    smoke: bool = True,
    exit_when_ready: bool = False,
    extra_args: Sequence[str] = (),
    *,
    planner: Planner | None = None,
    doctor: Doctor | None = None,
    server_cmd: Sequence[str] | None = None,
    stop_timeout: float = STOP_TIMEOUT_S,
) -> int:
    """`gputune launch` (see the module docstring). ``planner``, ``doctor`` and ``server_cmd`` are
    injected by tests (a fake server script instead of vLLM); the CLI passes none of them."""
    started = time.monotonic()
    age = _process_age()
    from tuner.plan import check_options

    check_options(model, gpus, port, gpu_mem)
    if telemetry_interval <= 0 or ready_timeout <= 0:
        raise UsageError("--telemetry-interval and --ready-timeout must be positive")
    if auto_fix < 0:
        raise UsageError("--auto-fix must be 0 or more")
    opts = Options(
        host=host,
        port=port,
        api_key=api_key,
        allow_unauthenticated=allow_unauthenticated,
        run_dir=run_dir,
        force=force,
        dry_run=dry_run,
        auto_fix=auto_fix,
        telemetry_interval=telemetry_interval,
        ready_timeout=ready_timeout,
        smoke=smoke,
        exit_when_ready=exit_when_ready,
        stop_timeout=stop_timeout,
    )
    plan = (planner or _default_planner)(
        model=model,
        gpu_mem=gpu_mem,
        gpus=gpus,
        host=host,
        port=port,
        api_key_set=bool(api_key) or "--api-key" in extra_args,
        allow_unauthenticated=allow_unauthenticated,
        extra_args=tuple(extra_args),
        env=dict(os.environ),
    )
    vllm_args, key = prepare_args(plan, api_key)
    env_changes = env_for(plan, vllm_args, key)
    secrets = [key] if key else []
    final_host = flag_value(vllm_args, "--host") or host
    final_port_s = flag_value(vllm_args, "--port") or str(port)
    try:
        final_port = int(final_port_s)
    except ValueError as exc:
        raise UsageError(f"--port {final_port_s!r} is not a number") from exc
    numactl = shutil.which("numactl")
    refusal = None
    open_bind = not is_loopback(final_host) and not key and not allow_unauthenticated
    if open_bind:
        refusal = (
            f"refusing to serve on {final_host} (reachable from the network) without an API key;"
            " give --api-key (or VLLM_API_KEY), bind 127.0.0.1, or say --allow-unauthenticated"
        )
    elif not plan.feasible:
        refusal = f"the plan is not feasible: {plan.reason}"

    if dry_run:
        cmd = build_command(plan, vllm_args, env_changes, server_cmd, numactl)
        _print_dry_run(plan, cmd, secrets)
        if refusal:
            say(refusal)
            return int(ExitCode.BAD_ANSWER)
        return int(ExitCode.OK)
    if refusal:
        if not open_bind:
            say(refusal)
            for w in plan.warnings or []:
                say(f"  {w}")
            return int(ExitCode.BAD_ANSWER)
        raise BadAnswer(
            refusal, "a key: --api-key KEY or VLLM_API_KEY=KEY; it never appears on the command line"
        )

    path = run_dir or default_run_dir(plan.model_name or model)
    try:
        run = RunDir(path, secrets)
    except OSError as exc:
        raise UsageError(
            f"{path}: cannot keep the run's records there ({exc.strerror or exc})",
            "give --run-dir a folder you can write to",
        ) from exc
    stop = _Stop()
    stop.install()
    try:
        run.event(
            "start",
            f"gputune launch {plan.model_name or model}",
            run_dir=str(path),
            argv=sys.argv,
            process_age_at_main_s=round(age, 3) if age is not None else None,
            main_entered_mono=started,
        )
        run.write_json(PLAN, plan.to_dict())
        for w in plan.warnings or []:
            say(f"plan: {w}")
        say(f"run directory: {path}")
        # 1. the doctor
        problem = _run_doctor(run, doctor or live_doctor, force)
        if problem:
            _refuse(run, problem[0], problem[1])
            return int(ExitCode.BAD_ANSWER)
        # 2. the port, 3. host RAM for offload
        why = port_problem(final_host, final_port)
        if why:
            _refuse(
                run,
                why,
                f"choose another port (--port) or stop what listens: ss -ltnp 'sport = :{final_port}'",
            )
            return int(ExitCode.BAD_ANSWER)
        off = offload_gib(vllm_args)
        if off:
            import psutil

            avail = psutil.virtual_memory().available / (1 << 30)
            if off > avail:
                _refuse(
                    run,
                    f"--cpu-offload-gb {off:g} needs {off:g} GiB of host RAM; {avail:.1f} GiB is available",
                    "lower --cpu-offload-gb, free host memory, or use a smaller quantization",
                )
                return int(ExitCode.BAD_ANSWER)
        launch = Launch(plan, opts, run, key, server_cmd, started, stop)
        return launch.run_all(vllm_args, env_changes)
    finally:
        stop.restore()
        run.close()


def _process_age() -> float | None:
    """Seconds since this process started: CLOCK_BOOTTIME now minus field 22 (starttime, clock
    ticks after boot) of /proc/self/stat; 10 ms resolution, unlike psutil's create_time, which
    adds the boot time rounded to the second."""
    from tuner.host import Host

    stat = Host.live_host().read_text("/proc/self/stat").value
    if not stat or not hasattr(time, "CLOCK_BOOTTIME"):
        return None
    try:
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def _run_doctor(run: RunDir, doctor: Doctor, force: bool) -> tuple[str, str] | None:
    t0 = time.monotonic()
    try:
        findings = doctor()
    except Exception as exc:  # the doctor is advice; a broken one must not block serving
        run.write_json(DOCTOR, {"error": f"{type(exc).__name__}: {exc}"})
        run.event("doctor", f"the doctor could not run: {type(exc).__name__}: {exc}")
        say(f"warning: the doctor could not run ({type(exc).__name__}: {exc}); launching anyway")
        return None
    blocking = blocking_findings(findings)
    ids = [str(f.get("id")) for f in blocking]
    run.write_json(DOCTOR, {"findings": findings, "blocking": ids, "forced": force and bool(ids)})
    run.event(
        "doctor",
        f"doctor: {len(findings)} findings, {len(ids)} blocking",
        blocking=ids,
        seconds=round(time.monotonic() - t0, 3),
    )
    if not blocking:
        return None
    lines = "; ".join(f"{f.get('id')}: {f.get('summary')}" for f in blocking)
    if force:
        say(f"warning: the doctor found blocking problems, launching anyway (--force): {lines}")
        return None
    return (
        f"the doctor found problems that break serving: {lines}",
        "fix them (gputune doctor) or pass --force",
    )


def _refuse(run: RunDir, message: str, hint: str) -> None:
    run.event("refused", message, hint=hint)
    run.write_json(
        EXIT,
        {
            "returncode": None,
            "signal": None,
            "ended_at": utc_now_iso(),
            "reason": message,
            "stage": "refused",
            "attempt": 0,
        },
    )
    say(f"error: {message}")
    say(f"  hint: {hint}")


def _print_dry_run(plan: PlanLike, cmd: Command, secrets: Sequence[str]) -> None:
    d = plan.to_dict()
    out = sys.stdout
    print(
        f"# plan for {plan.model_name} ({plan.target} backend):"
        f" {'feasible' if plan.feasible else 'NOT feasible'}",
        file=out,
    )
    if not plan.feasible:
        print(f"#   {plan.reason}", file=out)
    for key in ("weights_bytes", "kv_bytes_per_token", "kv_cache_tokens", "max_model_len"):
        if d.get(key) is not None:
            print(f"#   {key}: {d[key]}", file=out)
    reasons = d.get("reasons") or {}
    if isinstance(reasons, Mapping):
        for k, v in reasons.items():
            print(f"#   {k}: {v}", file=out)
    for w in plan.warnings or []:
        print(f"#   warning: {w}", file=out)
    print(f"# numa: {cmd.numa_reason}", file=out)
    env = {k: (REDACTED if k == "VLLM_API_KEY" else v) for k, v in cmd.env_changes.items()}
    print(redact(shell_line(cmd.argv, env), secrets), file=out, flush=True)

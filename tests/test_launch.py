"""`gputune launch` without vLLM: a real HTTP server script stands in for it.

The stand-in (FAKE_SERVER below) is a real process tree: an HTTP server answering /health,
/v1/models, streaming /v1/completions and /metrics, which spawns a child that spawns a
grandchild, like vLLM's API server -> engine core -> worker. It can die at start with vLLM's
real "KV cache too small" message, ignore SIGTERM, and demand the API key from VLLM_API_KEY.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tuner import launch
from tuner.errors import BadAnswer, UsageError
from tuner.rundir import read_events

REPO = Path(__file__).resolve().parents[1]

FAKE_SERVER = textwrap.dedent(
    r"""
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    args = sys.argv[1:]
    def flag(name, default=None):  # the last occurrence wins, as with argparse
        for i, a in enumerate(args):
            if a == name and i + 1 < len(args):
                default = args[i + 1]
        return default

    port = int(flag("--port", "8000")); host = flag("--host", "127.0.0.1")
    model = flag("--model", "fake")
    capacity = int(os.environ.get("FAKE_KV_TOKENS", "1000000"))
    max_len = int(flag("--max-model-len", "1024"))
    key = os.environ.get("VLLM_API_KEY")
    print("fake vLLM argv:", json.dumps(args), flush=True)
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # engine core -> worker, like vLLM's tree (the grandchild ignores SIGTERM when asked to)
    code = ("import os,signal,subprocess,sys,time\n"
            "if os.environ.get('FAKE_IGNORE_TERM'): signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import os,signal,time\\n"
            "if os.environ.get(\"FAKE_IGNORE_TERM\"): signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
            "time.sleep(3600)'])\n"
            "time.sleep(3600)\n")
    engine = subprocess.Popen([sys.executable, "-c", code])
    print(f"engine pid {engine.pid}", flush=True)
    time.sleep(float(os.environ.get("FAKE_START_DELAY", "0.3")))
    need = max_len * 512
    if max_len > capacity:
        est = capacity
        print("(EngineCore pid=1) ERROR 11-29 16:09:38 [core.py:1510] ValueError: To serve at least one"
              f" request with the model's max seq len ({max_len}),"
              f" ({need / 2**30:.2f} GiB KV cache is needed,"
              " which is larger than the available KV cache memory (0.98 GiB). Based on the available memory,"
              f" the estimated maximum model length is {est}. Try increasing `gpu_memory_utilization` (which"
              " also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing"
              " the engine.", flush=True)
        print("RuntimeError: Engine core initialization failed. See root cause above.", flush=True)
        if not os.environ.get("FAKE_ORPHAN"):  # else the engine outlives the server, orphaned
            engine.kill()
        sys.exit(1)
    print(f"(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: {capacity:,} tokens",
          flush=True)

    METRICS = ('vllm:num_requests_running{engine="0"} 0.0\n'
               'vllm:num_requests_waiting{engine="0"} 0.0\n'
               'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'
               'vllm:num_preemptions_total{engine="0"} 0.0\n')

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass
        def _auth(self):
            if key and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {key}":
                self.send_response(401); self.end_headers(); return False
            return True
        def _send(self, code, body, ctype="application/json"):
            data = body.encode()
            self.send_response(code); self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
        def do_GET(self):
            if not self._auth():
                return
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": model}]}))
            elif self.path == "/metrics":
                self._send(200, METRICS, "text/plain")
            else:
                self._send(404, "{}")
        def do_POST(self):
            if not self._auth():
                return
            n = int(self.headers.get("Content-Length", 0)); req = json.loads(self.rfile.read(n))
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            for i in range(req.get("max_tokens", 16)):
                chunk = {"choices": [{"index": 0, "text": f" t{i}"}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode()); self.wfile.flush()
            usage = {"choices": [], "usage": {"completion_tokens": req.get("max_tokens", 16)}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    srv = ThreadingHTTPServer((host, port), H)
    print("INFO:     Application startup complete.", flush=True)
    try:
        srv.serve_forever()
    finally:
        engine.terminate()
    """
)


@dataclass
class FakePlan:
    """A plan as tuner.plan.build_plan returns it (the fields launch reads)."""

    model_name: str = "fake-model"
    vllm_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    feasible: bool = True
    reason: str = ""
    target: str = "cpu"
    warnings: list[str] = field(default_factory=list)
    numa_node: int | None = 0
    numa_reason: str = "CPU backend: node 0 has the most free memory"
    reasons: dict[str, str] = field(default_factory=lambda: {"--max-model-len": "fits the KV cache"})
    kv_cache_tokens: int = 2048

    def to_dict(self) -> dict[str, Any]:
        return {
            "feasible": self.feasible,
            "reason": self.reason,
            "target": self.target,
            "model_name": self.model_name,
            "vllm_args": self.vllm_args,
            "env": self.env,
            "reasons": self.reasons,
            "warnings": self.warnings,
            "numa_node": self.numa_node,
            "kv_cache_tokens": self.kv_cache_tokens,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def fake_server(tmp_path: Path) -> list[str]:
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER)
    return [sys.executable, str(script)]


def planner_for(port: int, host: str = "127.0.0.1", extra: list[str] | None = None, **kw: Any) -> Any:
    def plan(**req: Any) -> FakePlan:
        args = ["--model", "fake-model", "--host", host, "--port", str(port), "--max-model-len", "1024"]
        args += list(req.get("extra_args") or [])
        args += extra or []
        return FakePlan(vllm_args=args, **kw)

    return plan


def no_findings() -> list[dict[str, Any]]:
    return []


def run_launch(tmp_path: Path, server: list[str], port: int, **kw: Any) -> int:
    args: dict[str, Any] = {
        "model": "fake-model",
        "port": port,
        "run_dir": tmp_path / "run",
        "exit_when_ready": True,
        "telemetry_interval": 0.2,
        "ready_timeout": 60.0,
        "planner": planner_for(port),
        "doctor": no_findings,
        "server_cmd": server,
        "stop_timeout": 10.0,
    }
    args.update(kw)
    return launch.main(**args)


def _descendants_alive(marker: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


# ------------------------------------------------------------------------------------------------
# pure helpers
# ------------------------------------------------------------------------------------------------
def test_flag_value_takes_the_last_occurrence_in_both_spellings() -> None:
    args = ["--port", "1", "--max-model-len=2048", "--port", "8001"]
    assert launch.flag_value(args, "--port") == "8001"
    assert launch.flag_value(args, "--max-model-len") == "2048"
    assert launch.flag_value(args, "--host") is None
    assert launch.remove_flag(args, "--port") == ["--max-model-len=2048"]


def test_offload_is_counted_per_gpu() -> None:
    assert launch.offload_gib(["--cpu-offload-gb", "10", "--tensor-parallel-size", "2"]) == 20
    assert launch.offload_gib(["--cpu-offload-gb=4"]) == 4
    assert launch.offload_gib(["--max-model-len", "8"]) is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.org", False),
    ],
)
def test_loopback_addresses_are_told_apart(host: str, loopback: bool) -> None:
    assert launch.is_loopback(host) is loopback


def test_port_in_use_is_detected_and_free_port_is_not() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        why = launch.port_problem("127.0.0.1", port)
        assert why is not None and "already in use" in why
    assert launch.port_problem("127.0.0.1", free_port()) is None


# ------------------------------------------------------------------------------------------------
# process tree
# ------------------------------------------------------------------------------------------------
def _start_tree(server: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [*server, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    end = time.monotonic() + 20
    while time.monotonic() < end and len(launch.tree_pids(proc.pid)) < 3:
        time.sleep(0.05)
    return proc


def test_stop_process_tree_leaves_no_orphans(fake_server: list[str]) -> None:
    proc = _start_tree(fake_server, free_port())
    pids = launch.tree_pids(proc.pid)
    assert len(pids) >= 3  # server, engine, worker
    report = launch.stop_process_tree(proc, timeout=10)
    assert set(pids) <= set(report.pids)
    assert report.left == []
    assert report.graceful
    assert not [
        p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


def test_stop_process_tree_kills_what_ignores_sigterm(fake_server: list[str]) -> None:
    proc = _start_tree(fake_server, free_port(), {"FAKE_IGNORE_TERM": "1"})
    pids = launch.tree_pids(proc.pid)
    report = launch.stop_process_tree(proc, timeout=1.0)
    assert not report.graceful
    assert set(report.killed) >= {proc.pid}
    assert report.left == []
    assert proc.returncode == -signal.SIGKILL
    assert not [
        p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


# ------------------------------------------------------------------------------------------------
# a whole launch (in process)
# ------------------------------------------------------------------------------------------------
def test_launch_serves_smokes_records_and_stops_cleanly(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port)
    assert rc == 0
    run = tmp_path / "run"
    for name in (
        "command.json",
        "plan.json",
        "doctor.json",
        "vllm.log",
        "events.jsonl",
        "telemetry.csv",
        "gpu-processes.csv",
        "metrics.csv",
        "smoke.json",
        "exit.json",
    ):
        assert (run / name).is_file(), name
    cmd = json.loads((run / "command.json").read_text())
    assert Path(cmd["argv"][0]).name == "numactl" and cmd["numa"]["bound"] is True
    assert cmd["argv"][1:3] == ["--cpunodebind=0", "--membind=0"]
    kinds = [e["kind"] for e in read_events(run / "events.jsonl")]
    for kind in ("start", "doctor", "exec", "startup_complete_seen", "ready", "smoke", "stop"):
        assert kind in kinds, kind
    assert kinds.index("exec") < kinds.index("ready") < kinds.index("stop")
    smoke = json.loads((run / "smoke.json").read_text())
    assert smoke["ok"] and len(smoke["requests"]) == 3
    assert all(r["tokens"] == 16 and r["ttft_s"] is not None for r in smoke["requests"])
    exit_ = json.loads((run / "exit.json").read_text())
    assert exit_["stage"] == "stopped" and exit_["attempt"] == 1
    assert "fake vLLM argv" in (run / "vllm.log").read_text()
    assert capsys.readouterr().out.strip() == f"http://127.0.0.1:{port}/v1"
    assert not _descendants_alive(str(tmp_path / "fake_vllm.py"))


def test_server_dying_before_ready_is_recorded_with_its_log(
    tmp_path: Path, fake_server: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KV_TOKENS", "2048")
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, extra_args=["--max-model-len", "4096"])
    assert rc == 1
    run = tmp_path / "run"
    exit_ = json.loads((run / "exit.json").read_text())
    assert exit_["stage"] == "startup"
    assert exit_["returncode"] == 1
    assert "estimated maximum model length" in (run / "vllm.log").read_text()
    assert not _descendants_alive(str(tmp_path / "fake_vllm.py"))


def test_processes_orphaned_by_a_dead_server_are_stopped_too(
    tmp_path: Path, fake_server: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_KV_TOKENS", "2048")
    monkeypatch.setenv("FAKE_ORPHAN", "1")
    rc = run_launch(tmp_path, fake_server, free_port(), extra_args=["--max-model-len", "4096"])
    assert rc == 1
    ended = next(e for e in read_events(tmp_path / "run" / "events.jsonl") if e["kind"] == "exit")
    assert len(ended["data"]["leftovers"]) >= 1  # the engine (and its worker) outlived the server
    assert not _descendants_alive(str(tmp_path / "fake_vllm.py"))
    assert ended["data"]["left_running"] == []


def test_port_in_use_refuses_with_a_clear_message(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc = run_launch(tmp_path, fake_server, port)
    assert rc == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err
    assert json.loads((tmp_path / "run" / "exit.json").read_text())["stage"] == "refused"
    assert not (tmp_path / "run" / "vllm.log").exists()


def test_non_loopback_bind_without_key_is_refused(tmp_path: Path, fake_server: list[str]) -> None:
    port = free_port()
    with pytest.raises(BadAnswer, match="without an API key"):
        run_launch(tmp_path, fake_server, port, host="0.0.0.0", planner=planner_for(port, host="0.0.0.0"))
    # the final command counts: a --host after `--` is caught too
    with pytest.raises(BadAnswer):
        run_launch(tmp_path, fake_server, port, extra_args=["--host", "0.0.0.0"])
    assert not (tmp_path / "run").exists()


def test_non_loopback_bind_is_allowed_when_the_user_says_so(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    rc = run_launch(
        tmp_path,
        fake_server,
        port,
        dry_run=True,
        allow_unauthenticated=True,
        extra_args=["--host", "0.0.0.0"],
    )
    assert rc == 0
    assert "--host 0.0.0.0" in capsys.readouterr().out


def test_api_key_goes_through_the_environment_and_is_redacted_everywhere(
    tmp_path: Path, fake_server: list[str]
) -> None:
    secret = "sk-test-5f2b9c1e-do-not-leak"
    port = free_port()
    # the user also put a key after `--`: it is moved to the environment, not kept on the command line
    rc = run_launch(tmp_path, fake_server, port, api_key=secret, extra_args=["--api-key", secret])
    assert rc == 0  # the fake server demands the key on /v1/models: readiness proves it arrived
    run = tmp_path / "run"
    cmd = json.loads((run / "command.json").read_text())
    assert "--api-key" not in cmd["argv"]
    assert cmd["env"]["VLLM_API_KEY"] == "***"
    for f in run.rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f.name


def test_dry_run_prints_plan_and_command_and_starts_nothing(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, dry_run=True, api_key="sk-hidden-123")
    out = capsys.readouterr().out
    assert rc == 0
    assert "# plan for fake-model (cpu backend): feasible" in out
    assert "--max-model-len: fits the KV cache" in out
    last = out.strip().splitlines()[-1]
    assert "--cpunodebind=0 --membind=0" in last and f"--port {port}" in last
    assert "VLLM_API_KEY='***'" in last or "VLLM_API_KEY=***" in last
    assert "sk-hidden-123" not in out
    assert not (tmp_path / "run").exists()


def test_dry_run_of_an_infeasible_plan_exits_1(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    planner = planner_for(port, feasible=False, reason="72B weights need 41 GiB; the card has 8 GiB")
    rc = run_launch(tmp_path, fake_server, port, dry_run=True, planner=planner)
    assert rc == 1
    assert "NOT feasible" in capsys.readouterr().out


def test_blocking_doctor_failure_stops_the_launch_unless_forced(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    def doctor() -> list[dict[str, Any]]:
        return [
            {"id": "pcie.link", "status": "fail", "summary": "GPU 0 link trained at x4 of x16"},
            {"id": "cpu.governor", "status": "fail", "summary": "powersave"},  # slow, not blocking
        ]

    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, doctor=doctor)
    assert rc == 1
    assert "pcie.link" in capsys.readouterr().err
    doc = json.loads((tmp_path / "run" / "doctor.json").read_text())
    assert doc["blocking"] == ["pcie.link"]
    rc = run_launch(tmp_path, fake_server, port, doctor=doctor, force=True, run_dir=tmp_path / "forced")
    assert rc == 0
    assert json.loads((tmp_path / "forced" / "doctor.json").read_text())["forced"] is True


def test_offload_beyond_host_ram_is_refused(tmp_path: Path, fake_server: list[str]) -> None:
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, extra_args=["--cpu-offload-gb", "100000"])
    assert rc == 1
    assert "--cpu-offload-gb" in json.loads((tmp_path / "run" / "exit.json").read_text())["reason"]


def test_unknown_numa_node_launches_unbound_and_says_why(
    tmp_path: Path, fake_server: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    planner = planner_for(port, numa_node=None, numa_reason="the GPU's NUMA node is not reported")
    rc = run_launch(tmp_path, fake_server, port, planner=planner, smoke=False)
    assert rc == 0
    cmd = json.loads((tmp_path / "run" / "command.json").read_text())
    assert cmd["numa"]["bound"] is False and "numactl" not in cmd["argv"][0]
    assert "launching unbound" in capsys.readouterr().err


def test_usage_errors_are_usage_errors(tmp_path: Path, fake_server: list[str]) -> None:
    with pytest.raises(UsageError):
        run_launch(tmp_path, fake_server, 0)
    with pytest.raises(UsageError):
        run_launch(tmp_path, fake_server, free_port(), model="")


def test_user_kv_size_on_the_command_line_wins_over_the_plans_variable() -> None:
    plan = FakePlan(vllm_args=["--kv-cache-memory-bytes", "1048576"], env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        assert "VLLM_CPU_KVCACHE_SPACE" not in launch.env_for(plan, plan.vllm_args, None)
        assert launch.env_for(FakePlan(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), [], "k") == {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_API_KEY": "k",
        }
    finally:
        if saved is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


# ------------------------------------------------------------------------------------------------
# gputune as its own process: signals
# ------------------------------------------------------------------------------------------------
DRIVER = """
import sys
from pathlib import Path
from tests.test_launch import no_findings, planner_for
from tuner import launch
port, run_dir, server = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
sys.exit(launch.main(model="fake-model", port=port, run_dir=run_dir, telemetry_interval=0.2,
                     planner=planner_for(port), doctor=no_findings, server_cmd=server, stop_timeout=10.0))
"""


def _start_gputune(tmp_path: Path, server: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(free_port()), str(run), *server],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if any(e["kind"] == "ready" for e in read_events(run / "events.jsonl")):
            return proc, run
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"gputune never got ready: {proc.communicate()}")


def test_sigterm_to_gputune_stops_the_tree_and_exits_0(tmp_path: Path, fake_server: list[str]) -> None:
    proc, run = _start_gputune(tmp_path, fake_server)
    server_pid = next(e["data"]["pid"] for e in read_events(run / "events.jsonl") if e["kind"] == "exec")
    tree = launch.tree_pids(server_pid)
    assert len(tree) >= 3
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    exit_ = json.loads((run / "exit.json").read_text())
    assert exit_["stage"] == "stopped" and "SIGTERM" in exit_["reason"]
    stop = next(e for e in read_events(run / "events.jsonl") if e["kind"] == "stop")
    assert stop["data"]["left"] == []
    assert not _descendants_alive(str(tmp_path / "fake_vllm.py"))


def test_sigkill_of_gputune_keeps_every_stream_and_takes_the_server_down(
    tmp_path: Path, fake_server: list[str]
) -> None:
    proc, run = _start_gputune(tmp_path, fake_server)
    time.sleep(0.6)  # a few telemetry and metrics samples
    proc.kill()
    proc.wait(timeout=10)
    # the streams are whole: every event line parses, the log holds the server's output
    lines = (run / "events.jsonl").read_text().splitlines()
    assert lines and all(json.loads(line)["kind"] for line in lines)
    assert "Application startup complete" in (run / "vllm.log").read_text()
    assert (run / "telemetry.csv").read_text().startswith("time,gpu,mem_used_mib")
    metrics = (run / "metrics.csv").read_text().splitlines()
    assert metrics[0] == "time,kv_cache_usage,running,waiting,preemptions"
    assert all(line.count(",") == 4 for line in metrics)
    for name in ("command.json", "plan.json", "doctor.json", "smoke.json"):
        json.loads((run / name).read_text())
    # the server got SIGTERM from the kernel when its parent died (PR_SET_PDEATHSIG)
    end = time.monotonic() + 20
    while time.monotonic() < end and _descendants_alive(str(tmp_path / "fake_vllm.py")):
        time.sleep(0.1)
    assert not _descendants_alive(str(tmp_path / "fake_vllm.py"))


# ------------------------------------------------------------------------------------------------
# auto-fix, with the real triage on vLLM's real error message
# ------------------------------------------------------------------------------------------------
def test_auto_fix_relaunches_with_the_length_vllm_estimated(
    tmp_path: Path, fake_server: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tuner.triage")
    monkeypatch.setenv("FAKE_KV_TOKENS", "2048")
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, auto_fix=1, extra_args=["--max-model-len", "4096"])
    assert rc == 0
    run = tmp_path / "run"
    assert json.loads((run / "exit.json").read_text())["stage"] == "startup"
    second = run / "attempt-2"
    for name in ("command.json", "plan.json", "vllm.log", "telemetry.csv", "exit.json"):
        assert (second / name).is_file(), name
    argv = json.loads((second / "command.json").read_text())["argv"]
    assert launch.flag_value(argv, "--max-model-len") == "2048"
    assert json.loads((second / "exit.json").read_text())["stage"] == "stopped"
    kinds = [e["kind"] for e in read_events(run / "events.jsonl")]
    assert kinds.count("exec") == 2 and "diagnosis" in kinds and "relaunch" in kinds


def test_auto_fix_gives_up_after_n_attempts(
    tmp_path: Path, fake_server: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tuner.triage")
    monkeypatch.setenv("FAKE_KV_TOKENS", "2048")
    port = free_port()
    rc = run_launch(tmp_path, fake_server, port, auto_fix=0, extra_args=["--max-model-len", "4096"])
    assert rc == 1
    assert not (tmp_path / "run" / "attempt-2").exists()


# ------------------------------------------------------------------------------------------------
# the real command line and the real plan (no vLLM start)
# ------------------------------------------------------------------------------------------------
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "VLLM_CPU_KVCACHE_SPACE")}
    return subprocess.run(
        [sys.executable, "-m", "tuner", "launch", *args],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_dry_run_of_the_tiny_model_shows_the_numactl_command(tiny_llama: Path, tmp_path: Path) -> None:
    res = _cli("--model", str(tiny_llama), "--port", "8123", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert "VLLM_CPU_KVCACHE_SPACE=" in line
    assert "--cpunodebind=" in line and "-m vllm.entrypoints.openai.api_server" in line
    assert f"--model {tiny_llama}" in line and "--port 8123" in line
    assert not (tmp_path / "runs").exists()


def test_cli_refuses_an_open_bind_with_exit_1_and_one_message(tiny_llama: Path, tmp_path: Path) -> None:
    res = _cli("--model", str(tiny_llama), "--host", "0.0.0.0", cwd=tmp_path)
    assert res.returncode == 1
    assert "without an API key" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_run_dir_that_cannot_be_made_is_a_usage_error(tmp_path: Path, fake_server: list[str]) -> None:
    (tmp_path / "a-file").write_text("not a folder\n")
    with pytest.raises(UsageError, match="cannot keep the run's records"):
        run_launch(tmp_path, fake_server, free_port(), run_dir=tmp_path / "a-file" / "run")

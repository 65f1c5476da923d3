"""Produce a real PyTorch DataLoader failure for the triage corpus: a worker killed by the kernel's OOM
killer under a cgroup-v1 memory limit.

    sudo .venv/bin/python tests/corpus/make_torch_failures.py

Writes beside this script ``cpu-torch-dataloader-worker-oom-killed.log`` (the training script's whole
output), ``.dmesg.txt`` (the kernel lines written while it ran) and ``.toml`` (label, exit status,
command, the evidence line). Needs root and /sys/fs/cgroup/memory; CI does not regenerate these files.
"""

from __future__ import annotations

import json
import re
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


def main() -> None:
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text(str(LIMIT))
    with tempfile.TemporaryDirectory() as tmp:
        train = Path(tmp) / "train.py"
        train.write_text(TRAIN)
        before = dmesg()
        started = time.monotonic()
        log_path = HERE / f"{NAME}.log"
        inner = f"echo $$ > {CGROUP}/cgroup.procs && exec {sys.executable} {train}"
        with log_path.open("wb") as log:
            argv = ["/bin/sh", "-c", inner]
            rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=600).returncode
        elapsed = time.monotonic() - started
    kernel = [ln for ln in dmesg()[len(before) :] if re.search(r"oom|Killed process|Memory cgroup", ln, re.I)]
    (HERE / f"{NAME}.dmesg.txt").write_text("\n".join(kernel) + "\n")
    text = log_path.read_text(errors="replace")
    evidence = next((ln for ln in text.splitlines() if "is killed by signal" in ln), "")
    import torch

    toml = (
        f"# Real failure of a PyTorch {torch.__version__} DataLoader made here by {SCRIPT}\n"
        f'source = "generated: torch {torch.__version__} (CPU) on this machine, {SCRIPT}"\n'
        'label = "host_ram_oom_killed"\n'
        f"exit_code = {rc}\n"
        f'dmesg = "{NAME}.dmesg.txt"\n'
        f"evidence = {json.dumps(evidence.strip()[:400])}\n"
        'command = "train.py (a DataLoader of 2 workers whose dataset caches every sample) in a cgroup of '
        f'{LIMIT // 1024**2} MiB"\n'
        f"seconds = {elapsed:.0f}\n"
    )
    (HERE / f"{NAME}.toml").write_text(toml)
    print(f"rc={rc} {elapsed:.0f}s evidence={evidence!r} kernel={len(kernel)} lines")


if __name__ == "__main__":
    main()

"""A CUDA OOM in a process that shares its GPU with another job, as PyTorch reports it: the fact triage
reads to name memory held by another process (the start-up free-memory label) rather than a model too big.

    python3 bench/gpu/other_process.py [--out DIR] [--hold 0.6]   # on a GPU host; < 1 minute on an H200

A holder process takes a share of GPU 0 (--hold of its total) and keeps it. Then a second process creates
weight-sized tensors one at a time (512 MiB, as a loader does) until PyTorch raises torch.OutOfMemoryError,
and prints PyTorch's own message. It runs twice:

  same-namespace   the second process as usual: NVML finds its pid, so PyTorch writes 'this process has X
                   memory in use' and lists the holder as 'Process N has Y memory in use'
  pid-namespace    the second process in a new pid namespace (unshare --pid --fork --mount-proc as root), as
                   in a container: NVML shows it only the processes of its own namespace, so the message
                   names no other process and the other job's memory shows only in the figures (total,
                   free and this process's own)

One JSON line per scenario; with --out, each message goes to DIR/<scenario>.log. A scenario that cannot
run here (unshare refused) says so in its line. Nothing here changes the GPU's settings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

CHUNK = 512 * 2**20


def holder(share: float) -> int:
    import torch as t

    total = t.cuda.get_device_properties(0).total_memory
    x = t.empty(int(total * share), dtype=t.uint8, device="cuda")
    x.fill_(1)
    print(json.dumps({"held_bytes": x.numel(), "pid": os.getpid()}), flush=True)
    time.sleep(120)  # the parent kills it sooner
    return 0


def victim() -> int:
    import torch as t

    params = []
    try:
        while True:
            p = t.empty(CHUNK, dtype=t.uint8, device="cuda")
            p.fill_(1)
            params.append(p)
    except t.OutOfMemoryError as e:
        print(
            json.dumps(
                {
                    "message": str(e).strip(),
                    "chunks": len(params),
                    "pid_seen": os.getpid(),
                    "torch": t.__version__,
                    "device": t.cuda.get_device_name(0),
                }
            ),
            flush=True,
        )
        return 0
    return 1


def run_scenario(name: str, prefix: list[str]) -> dict[str, object]:
    cmd = [*prefix, sys.executable, os.path.abspath(__file__), "--child", "victim"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"scenario": name, "error": (r.stderr or r.stdout)[-1500:], "command": cmd[: len(prefix)]}
    out: dict[str, object] = {"scenario": name}
    out.update(json.loads(lines[-1]))
    out["this_process_line"] = "this process has" in str(out.get("message", ""))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for one .log per scenario (the OOM as PyTorch printed it)")
    ap.add_argument("--hold", type=float, default=0.6, help="share of GPU 0 the other job holds")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "holder":
        return holder(a.hold)
    if a.child == "victim":
        return victim()
    hold = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", "holder", "--hold", str(a.hold)],
        stdout=subprocess.PIPE,
        text=True,
    )
    rc = 0
    try:
        assert hold.stdout is not None
        ready = hold.stdout.readline()
        if not ready.startswith("{"):
            print(json.dumps({"error": "the holder did not start", "output": ready}))
            return 1
        held = json.loads(ready)
        print(json.dumps({"holder": held}), flush=True)
        scenarios: list[tuple[str, list[str]]] = [("same-namespace", [])]
        unshare = shutil.which("unshare")
        if unshare:
            # in a user namespace, or in a pid namespace without its own /proc, CUDA's initialisation
            # fails ('Error 304: OS call failed or operation not supported on this OS'); root enters a pid
            # namespace with its own /proc, as a container does
            user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            scenarios.append(("pid-namespace", [unshare, *user, "--pid", "--fork", "--mount-proc"]))
        else:
            print(json.dumps({"scenario": "pid-namespace", "error": "no unshare on this host"}))
        for name, prefix in scenarios:
            rec = run_scenario(name, prefix)
            print(json.dumps(rec), flush=True)
            if "error" in rec:
                rc = 1
                continue
            if a.out:
                os.makedirs(a.out, exist_ok=True)
                with open(os.path.join(a.out, f"{name}.log"), "w") as f:
                    f.write(
                        f"# bench/gpu/other_process.py scenario {name}: another process (pid {held['pid']}) "
                        f"holds {held['held_bytes'] / 2**30:.2f} GiB of GPU 0\n"
                    )
                    f.write(f"torch.OutOfMemoryError: {rec['message']}\n")
    finally:
        hold.kill()
        hold.wait()
    return rc


if __name__ == "__main__":
    sys.exit(main())

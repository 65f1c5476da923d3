"""Real GPU failures that are not an exhausted card: graph capture, a sanitizer report, PyTorch checks.

    PYTHONPATH=. python3 bench/gpu/capture_failures.py --out DIR     # on a GPU host; seconds on an H200

Model code that a CUDA graph cannot record fails while vLLM or SGLang captures its graphs, and the fix is
to run without graphs (vLLM --enforce-eager), not more memory. Each scenario captures a small matmul
with `torch.cuda.graph` and, inside the capture, makes one call a graph cannot hold:

  capture-sync   `.item()` on a GPU tensor: a device-to-host copy and a sync on the capturing stream,
                 refused by CUDA (cudaErrorStreamCaptureUnsupported, 'operation not permitted when stream
                 is capturing')
  capture-rng-offset
                 the default CUDA generator's `set_offset()`: moving the RNG's Philox offset, which
                 PyTorch refuses itself (aten/src/ATen/cuda/CUDAGraphsUtils.cuh assertNotCapturing:
                 'Cannot call CUDAGeneratorImpl::set_offset during CUDA graph capture. If you need this
                 call to be captured, please file an issue.'; older releases refused current_seed too,
                 torch 2.11 no longer does)
  sanitizer-oob  a CUDA C++ kernel built with nvcc that writes one element past its buffer, run under
                 compute-sanitizer's memcheck ('Invalid __global__ write of size 4 bytes'): the tool's
                 report of a kernel bug; skipped where nvcc or compute-sanitizer is missing or refuses

PyTorch's own checks, whose messages triage must not read as something else:

  alloc-1eb      `torch.empty(2**61 bytes)` on the GPU: the caching allocator's guard against a corrupt
                 size ('CUDA out of memory. Tried to allocate more than 1EB memory.'), not an exhausted card
  alloc-2pib     `torch.empty(2**51 bytes)`: a 2 PiB request, more than any machine has, reported with the
                 card's real figures ('Tried to allocate 2097152.00 GiB ...')
  cross-device   a CUDA tensor added to a CPU tensor ('Expected all tensors to be on the same device')
  matmul-shapes  `torch.mm` of 8x3840 by 5632x1024 ('mat1 and mat2 shapes cannot be multiplied')
  data-parallel-device
                 `torch.nn.DataParallel` over GPU 0 whose model was moved back to the CPU ('module must have
                 its parameters and buffers on device cuda:0 (device_ids[0]) but found one of them on
                 device: cpu'): a device placement, not memory

An exhausted card that NCCL finds first:

  nccl-oom       the card filled by this process's own tensors (down to the last MiB), then a one-rank
                 NCCL process group and an all_reduce: NCCL's buffers get no memory ('NCCL WARN Cuda
                 failure 2 'out of memory'', the numbered form of NCCL 2.19 on), read as an OOM whatever
                 the NCCL error that wraps it says

A device assignment, not a link:

  nccl-duplicate-gpu
                 two ranks of one NCCL process group both on GPU 0 (as a launcher that sets the same
                 CUDA_VISIBLE_DEVICES for every rank does): NCCL refuses the communicator ('Duplicate GPU
                 detected : rank 1 and rank 0 both on CUDA device ...', ncclInvalidUsage)

Each scenario runs in its own process; its stdout and stderr (the traceback as Python prints it) go to
DIR/<scenario>.log and its exit status to DIR/<scenario>.rc, and `gputune triage` reads the log into
DIR/triage-<scenario>.json. One JSON line per scenario on stdout. Nothing here changes a GPU setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

SCENARIOS = (
    "capture-sync",
    "capture-rng-offset",
    "sanitizer-oob",
    "alloc-1eb",
    "alloc-2pib",
    "cross-device",
    "matmul-shapes",
    "data-parallel-device",
    "nccl-oom",
    "nccl-duplicate-gpu",
)
# a kernel that writes one element past its buffer, for compute-sanitizer's memcheck
OOB_KERNEL = r"""
#include <cstdio>
__global__ void fill(float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 1.0f;  // i == n is one past the end
}
int main() {
  const int n = 256; float* d = nullptr;
  cudaMalloc(&d, n * sizeof(float));
  fill<<<1, n + 32>>>(d, n);
  cudaError_t e = cudaDeviceSynchronize();
  printf("kernel finished: %s\n", cudaGetErrorString(e));
  cudaFree(d);
  return e == cudaSuccess ? 0 : 1;
}
"""


def sanitizer_oob(work: Path) -> int:
    """Build the out-of-bounds kernel with nvcc and run it under compute-sanitizer (memcheck)."""
    import shutil

    nvcc, sanitizer = shutil.which("nvcc"), shutil.which("compute-sanitizer")
    if not nvcc or not sanitizer:
        print(
            f"skipped: nvcc {nvcc or 'not found'}, compute-sanitizer {sanitizer or 'not found'}", flush=True
        )
        return 125
    src = work / "oob.cu"
    src.write_text(OOB_KERNEL)
    exe = work / "oob"
    built = subprocess.run([nvcc, "-o", str(exe), str(src)], capture_output=True, text=True)
    if built.returncode:
        print("nvcc failed:", built.stderr[-2000:], flush=True)
        return 125
    print(f"$ compute-sanitizer --tool memcheck {exe.name}", flush=True)
    return subprocess.run([sanitizer, "--tool", "memcheck", str(exe)]).returncode


def data_parallel_model_moved_off(torch: Any) -> Any:  # torch is imported by the child only
    """DataParallel over GPU 0 (which moves a one-device model there), then the model moved back to the
    CPU, as code that calls .cpu() or .to(other) on the wrapped module does."""
    wrapped = torch.nn.DataParallel(torch.nn.Linear(64, 64), device_ids=[0])
    wrapped.module.cpu()
    return wrapped


def nccl_on_a_full_card(torch: Any) -> None:  # torch is imported by the child only
    """Fill GPU 0 with this process's own tensors, then start NCCL on it (one rank) and all_reduce."""
    import socket

    import torch.distributed as dist

    os.environ.setdefault("NCCL_DEBUG", "WARN")
    x = torch.ones(1 << 20, device="cuda")  # the collective's own tensor, made before the card is full
    hold = []
    for size in (1 << 30, 1 << 26, 1 << 20):
        while True:
            try:
                hold.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                break
    free, total = torch.cuda.mem_get_info()
    print(
        f"holding {sum(t.numel() for t in hold) / 2**30:.2f} GiB; {free / 2**20:.0f} MiB free of "
        f"{total / 2**30:.2f} GiB; NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}",
        flush=True,
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def _duplicate_rank(rank: int, port: int) -> None:  # a child of torch.multiprocessing.spawn
    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_DEBUG", "WARN")
    torch.cuda.set_device(0)  # every rank on GPU 0
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.ones(1024, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.destroy_process_group()


def two_ranks_on_one_gpu(torch: Any) -> None:  # torch is imported by the child only
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    print(f"2 ranks, both on cuda:0, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", flush=True)
    mp.spawn(_duplicate_rank, args=(port,), nprocs=2, join=True)


def scenario(name: str, work: Path) -> int:
    if name == "sanitizer-oob":
        return sanitizer_oob(work)
    import torch

    checks = {
        "alloc-1eb": lambda: torch.empty(2**61, dtype=torch.uint8, device="cuda"),
        "alloc-2pib": lambda: torch.empty(2**51, dtype=torch.uint8, device="cuda"),
        "cross-device": lambda: torch.ones(4, device="cuda") + torch.ones(4),
        "matmul-shapes": lambda: torch.mm(
            torch.randn(8, 3840, device="cuda"), torch.randn(5632, 1024, device="cuda")
        ),
        "data-parallel-device": lambda: data_parallel_model_moved_off(torch)(
            torch.randn(8, 64, device="cuda")
        ),
        "nccl-oom": lambda: nccl_on_a_full_card(torch),
        "nccl-duplicate-gpu": lambda: two_ranks_on_one_gpu(torch),
    }
    if name in checks:
        print(f"{name} on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
        checks[name]()
        torch.cuda.synchronize()
        print("no error", flush=True)
        return 0
    a = torch.randn(1024, 1024, device="cuda")
    b = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (a @ b).sum()  # warm-up outside the capture, as vLLM's capture does
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    print(
        f"capturing a CUDA graph ({name}) on {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
        flush=True,
    )
    with torch.cuda.graph(graph):
        c = a @ b
        if name == "capture-sync":
            c.sum().item()
        else:
            torch.cuda.default_generators[0].set_offset(0)
    graph.replay()
    torch.cuda.synchronize()
    print("captured without an error", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("capture-failures"))
    ap.add_argument("--only", action="append", choices=SCENARIOS, help="run these scenarios (default: all)")
    ap.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)  # the child's own run
    opts = ap.parse_args()
    if opts.scenario:
        return scenario(opts.scenario, opts.out)
    opts.out.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))
    )
    for name in opts.only or SCENARIOS:
        log = opts.out / f"{name}.log"
        with log.open("wb") as fh:
            rc = subprocess.run(
                [sys.executable, __file__, "--scenario", name, "--out", str(opts.out)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
            ).returncode
        (opts.out / f"{name}.rc").write_text(f"{rc}\n")
        triage = subprocess.run(
            [sys.executable, "-m", "tuner", "triage", str(log), "--exit-code", str(rc), "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
        )
        (opts.out / f"triage-{name}.json").write_text(triage.stdout)
        try:
            doc = json.loads(triage.stdout)
            cause, flags = doc.get("cause"), doc.get("remediation", {}).get("flag_changes")
        except json.JSONDecodeError:
            cause, flags = None, None
        print(json.dumps({"scenario": name, "exit": rc, "triage": cause, "flag_changes": flags}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env bash
# Produce REAL non-memory GPU failures for the triage corpus with PyTorch only (no vLLM), on the lookalike
# side of the labels: triage must name them without a memory label.
#
#   OUT=/some/dir bash bench/gpu/failures.sh   # from the repository root; < 3 minutes; writes $OUT/failures.tgz
#
# Scenarios (all output is PyTorch's, NCCL's or Triton's own):
#   device-assert   an out-of-range index on the GPU -> 'CUDA error: device-side assert triggered'
#   illegal-access  a Triton kernel that stores far outside its buffer -> 'an illegal memory access was
#                   encountered' (the process's CUDA context is lost; other processes are not affected)
#   nccl-timeout    two ranks on two GPUs, one skips an all-reduce -> the NCCL watchdog's collective timeout
#                   (needs 2 GPUs; skipped with one)
#   nccl-no-iface   two ranks whose NCCL_SOCKET_IFNAME names no interface -> NCCL's bootstrap cannot start
#                   (needs 2 GPUs)
#   pinned-host     page-locked host memory of 1.5 x the host's RAM, as --swap-space or a CPU KV tier asks
#                   for pinned buffers -> the host allocation fails (not the GPU's memory)
#   bad-ordinal     set_device(3) with CUDA_VISIBLE_DEVICES=0 -> 'invalid device ordinal' (a setup error)
# Read-only on the GPU's settings: no nvidia-smi -pm/-pl/-lgc/-r/-c/-mig.
set -u
. bench/gpu/corpus-lib.sh
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')

cat > "$W/device_assert.py" <<'PY'
import torch
x = torch.zeros(10, device="cuda")
idx = torch.tensor([20], device="cuda")
print("indexing a 10-element tensor at 20 on the GPU", flush=True)
y = x[idx]
print(y.sum().item(), flush=True)
PY

cat > "$W/illegal_access.py" <<'PY'
import torch, triton, triton.language as tl

@triton.jit
def store_far(ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(ptr + offs + (1 << 40), tl.zeros([BLOCK], dtype=tl.float32))   # no mask, 4 TiB past the end

x = torch.zeros(1024, device="cuda")
print("launching a kernel that writes 4 TiB past its buffer", flush=True)
store_far[(1,)](x, x.numel(), BLOCK=1024)
torch.cuda.synchronize()
print("finished", flush=True)
PY

cat > "$W/nccl_timeout.py" <<'PY'
import datetime, os, time, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {rank}: first all-reduce done", flush=True)
    if rank == 0:
        dist.all_reduce(t)            # rank 1 never joins this one
        torch.cuda.synchronize()
        print("rank 0: second all-reduce done", flush=True)
    else:
        time.sleep(60)

if __name__ == "__main__":
    mp.spawn(run, nprocs=2, join=True)
PY

cat > "$W/nccl_no_iface.py" <<'PY'
import os, torch, torch.distributed as dist, torch.multiprocessing as mp

def run(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29534")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2)
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    print(f"rank {rank}: all-reduce done", flush=True)

if __name__ == "__main__":
    mp.spawn(run, nprocs=2, join=True)
PY

cat > "$W/host_tier.py" <<'PY'
import os, torch
ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
want = int(1.5 * ram)
torch.cuda.init()
print(f"host RAM {ram >> 30} GiB; pinning {want >> 30} GiB of host memory for a CPU swap/offload tier", flush=True)
buf = torch.empty(want, dtype=torch.uint8, pin_memory=True)
print("pinned", flush=True)
PY

cat > "$W/bad_ordinal.py" <<'PY'
import torch
print(f"visible GPUs: {torch.cuda.device_count()}; selecting cuda:3", flush=True)
torch.cuda.set_device(3)
x = torch.zeros(1, device="cuda")
print("selected", flush=True)
PY

run_case() {  # name command...
  local name="$1"; shift
  "$@" > "$C/gpu-h200-$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$W/$name.rc"
  echo "$name: exit $rc ($(($(date +%s) - START)) s so far)"
}

run_case device-assert timeout 60 "$PY" "$W/device_assert.py"
run_case illegal-access timeout 90 "$PY" "$W/illegal_access.py"
if [ "$NGPU" -ge 2 ]; then
  run_case nccl-timeout timeout 120 "$PY" "$W/nccl_timeout.py"
  NCCL_SOCKET_IFNAME=nosuchif0 run_case nccl-no-iface timeout 120 "$PY" "$W/nccl_no_iface.py"
else
  echo "nccl-timeout, nccl-no-iface: skipped (one GPU)"
fi
run_case pinned-host timeout 180 "$PY" "$W/host_tier.py"
CUDA_VISIBLE_DEVICES=0 run_case bad-ordinal timeout 60 "$PY" "$W/bad_ordinal.py"

corpus_toml failures.sh device-assert illegal_memory_access_software_bug "an index out of range on the GPU trips PyTorch's device-side bounds assert: a software bug, not memory or hardware"
corpus_toml failures.sh illegal-access illegal_memory_access_software_bug "a Triton kernel stores 4 TiB past its buffer: CUDA reports an illegal memory access (a software bug; the hardware is fine)"
corpus_toml failures.sh nccl-timeout nccl_multi_gpu_comm_failure "rank 1 never joins rank 0's second all-reduce: the NCCL watchdog times the collective out after 20 s"
corpus_toml failures.sh nccl-no-iface nccl_multi_gpu_comm_failure "NCCL_SOCKET_IFNAME names no interface of the host: NCCL's bootstrap cannot open its sockets, so the communicator is never made"
corpus_toml failures.sh pinned-host host_pinned_memory_swap_space "page-locked host memory of 1.5 x the host's RAM is asked for (as --swap-space or a CPU KV tier pins buffers): the host allocation fails, the GPU's memory is untouched"
corpus_toml failures.sh bad-ordinal config_error_not_resource "CUDA_VISIBLE_DEVICES=0 leaves one GPU, and the script selects cuda:3: CUDA's invalid device ordinal, a setup error"
for name in device-assert illegal-access nccl-timeout nccl-no-iface pinned-host bad-ordinal; do
  triage_case "$name"
done
pack failures "nvrm|xid|out of memory|oom-kill|killed process"

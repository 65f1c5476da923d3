#!/usr/bin/env bash
# Produce new REAL GPU failures for the triage corpus with PyTorch only (no vLLM), each recorded with
# `nvidia-smi dmon -s pucvmet -o DT` and an NVML sampler side by side (as ../shared/tools/capture_host.sh
# made the fixtures/gpu-oom traces), plus the per-process GPU memory in the launch recorder's layout.
#
#   OUT=/some/dir bash bench/gpu/oom.sh        # from the repository root; < 3 minutes; writes $OUT/oom.tgz
#
# Scenarios (all output is PyTorch's own; nothing imitates vLLM's messages):
#   graph-capture   the card is filled to ~1 GiB free, then a CUDA graph is captured whose work needs more
#                   -> torch OOM raised while capturing (torch/cuda/graphs.py in the traceback)
#   other-process   a second process holds ~80% of the card; this one then asks for 0.9 x total memory as
#                   one block, the way a server reserves its budget -> torch OOM naming the other process
#   runtime-growth  a decode-like loop whose batch and cache grow every step until the allocator fails
#   full-card       another process holds all but ~64 MiB of the card; this one's first CUDA call (context
#                   creation) fails -> 'CUDA error: out of memory' without the allocator's numbers
#   cublas-full     this process has its context, then another process takes all but ~8 MiB; its first
#                   matmul creates the cuBLAS handle -> cuBLAS's allocation failure (or torch's OOM)
#   triton-full     this process fills the card itself, then a compiled Triton kernel whose values spill to
#                   local memory is loaded for its first launch -> 'Triton Error [CUDA]: out of memory'
#                   (the driver cannot reserve the kernel's local memory; outside PyTorch's allocator)
#   async-growth    runtime-growth under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync: the CUDA driver's
#                   stream-ordered pool fails instead of the caching allocator (its own OOM report)
#   expandable-growth
#                   runtime-growth under expandable_segments:True (the layout vLLM's sleep mode and many
#                   servers set): the OOM as the expandable allocator reports it
#   fraction-growth runtime-growth with torch.cuda.set_per_process_memory_fraction(0.25): the process's own
#                   budget runs out while most of the card is free (the OOM names the limit)
#   cudnn-full      this process has its context, then another process takes all but ~8 MiB; its first
#                   convolution creates the cuDNN handle and workspace -> cuDNN's failure (or torch's OOM)
#
# SCENARIOS="name ..." runs only those (default: all); the others' fixtures are left as they are.
# Read-only on the GPU's settings: no nvidia-smi -pm/-pl/-lgc/-r/-c/-mig.
set -u
. bench/gpu/corpus-lib.sh

cat > "$W/sampler.py" <<'PY'
# NVML at 10 Hz: unix time, used MiB, total MiB, GPU util %, memory util % (the fixtures' NVML CSV), and
# per-process memory at 1 Hz in the recorder's gpu-processes.csv layout (time,gpu,pid,name,used_mib).
import sys, time, pynvml as N
try:
    import psutil
except ImportError:
    psutil = None
N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0)
end = time.time() + float(sys.argv[1])
mem_out, proc_out = open(sys.argv[2], "w"), open(sys.argv[3], "w")
proc_out.write("time,gpu,pid,name,used_mib\n")
last_proc = 0.0
while time.time() < end:
    m = N.nvmlDeviceGetMemoryInfo(h); u = N.nvmlDeviceGetUtilizationRates(h)
    now = time.time()
    mem_out.write(f"{now:.3f},{m.used >> 20},{m.total >> 20},{u.gpu},{u.memory}\n"); mem_out.flush()
    if now - last_proc >= 1.0:
        last_proc = now
        try:
            procs = N.nvmlDeviceGetComputeRunningProcesses(h)
        except N.NVMLError:
            procs = []
        for p in procs:
            name = ""
            if psutil is not None:
                try:
                    name = psutil.Process(p.pid).name()
                except Exception:
                    name = ""
            used = (p.usedGpuMemory or 0) >> 20
            proc_out.write(f"{now:.3f},0,{p.pid},{name},{used}\n")
        proc_out.flush()
    time.sleep(0.1)
PY

cat > "$W/graph_capture.py" <<'PY'
import sys, time, torch
torch.cuda.init()
x = torch.randn(8192, 8192, device="cuda")            # 256 MiB
w = torch.randn(8192, 8192, device="cuda")
free, total = torch.cuda.mem_get_info()
hog = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda")   # leave ~1 GiB free
print(f"filled: {torch.cuda.mem_get_info()[0] >> 20} MiB free of {total >> 20} MiB", flush=True)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):                       # warm-up outside the graph, as graph capture requires
    y = x @ w
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
print("capturing a CUDA graph of 24 matmuls", flush=True)
with torch.cuda.graph(graph):
    outs = [x @ w for _ in range(24)]                # 24 x 256 MiB inside the graph's private pool
graph.replay()
print("captured", flush=True)
PY

cat > "$W/hog.py" <<'PY'
import sys, time, torch
free, total = torch.cuda.mem_get_info()
hog = torch.empty(int(total * float(sys.argv[1])), dtype=torch.uint8, device="cuda")
print(f"holding {hog.numel() >> 20} MiB of {total >> 20} MiB", flush=True)
time.sleep(float(sys.argv[2]))
PY

cat > "$W/hog_free.py" <<'PY'
# hold all of the card's free memory but LEAVE_MIB, then touch READY and wait
import sys, time, torch
leave, ready, secs = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
free, total = torch.cuda.mem_get_info()
hog = torch.empty(free - (leave << 20), dtype=torch.uint8, device="cuda")
print(f"holding {hog.numel() >> 20} MiB of {total >> 20} MiB", flush=True)
open(ready, "w").close()
time.sleep(secs)
PY

cat > "$W/first_call.py" <<'PY'
import torch
print("creating the CUDA context on a card another process filled", flush=True)
x = torch.zeros(1024, 1024, device="cuda")
print("context created", flush=True)
PY

cat > "$W/cublas_late.py" <<'PY'
import os, sys, time, torch
x = torch.randn(4096, 4096, device="cuda")
open(sys.argv[1], "w").close()
print(f"context and inputs ready ({torch.cuda.memory_allocated() >> 20} MiB); waiting for the other process", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
print(f"free now {torch.cuda.mem_get_info()[0] >> 20} MiB; first matmul", flush=True)
y = x @ x
torch.cuda.synchronize()
print("matmul done", flush=True)
PY

cat > "$W/budget.py" <<'PY'
import torch
free, total = torch.cuda.mem_get_info()
print(f"free {free >> 20} MiB of {total >> 20} MiB; reserving 0.9 x total = {int(0.9 * total) >> 20} MiB", flush=True)
budget = torch.empty(int(0.9 * total), dtype=torch.uint8, device="cuda")
print("reserved", flush=True)
PY

cat > "$W/runtime_growth.py" <<'PY'
import time, torch
torch.manual_seed(0)
d = 8192
w = torch.randn(d, d, device="cuda", dtype=torch.float16)
cache = []
batch = 64
for step in range(10_000):
    x = torch.randn(batch, 512, d, device="cuda", dtype=torch.float16)   # a prefill-sized activation
    y = torch.nn.functional.gelu(x @ w)
    cache.append(y.detach())                                            # kept, like a growing KV cache
    batch += 64
    if step % 5 == 0:
        print(f"step {step}: batch {batch}, allocated {torch.cuda.memory_allocated() >> 20} MiB", flush=True)
PY

cat > "$W/triton_full.py" <<'PY'
import torch, triton, triton.language as tl

@triton.jit
def spill(ptr, BLOCK: tl.constexpr):
    # one warp holds BLOCK floats: far more than its registers, so they spill to local memory, which the
    # driver reserves for every resident thread when the kernel is loaded
    offs = tl.arange(0, BLOCK)
    v = tl.load(ptr + offs)
    v = tl.cumsum(v, 0) * tl.flip(v, 0)
    tl.store(ptr + offs, v)

BLOCK = 1 << 15
x = torch.ones(BLOCK, device="cuda")
spill.warmup(x, BLOCK=BLOCK, num_warps=1, grid=(1,))  # compiled while memory is free
free, total = torch.cuda.mem_get_info()
print(f"free {free >> 20} MiB of {total >> 20} MiB; this process fills the card, then launches the kernel", flush=True)
hold, chunk = [], 1 << 30
while True:
    try:
        hold.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        if chunk <= (1 << 12):
            break
        chunk //= 2
print(f"holding {sum(h.numel() for h in hold) >> 20} MiB; free {torch.cuda.mem_get_info()[0] >> 20} MiB", flush=True)
spill[(1,)](x, BLOCK=BLOCK, num_warps=1)
torch.cuda.synchronize()
print("kernel ran", flush=True)
PY

cat > "$W/fraction_growth.py" <<'PY'
import runpy, sys, torch
torch.cuda.set_per_process_memory_fraction(0.25)
print("per-process memory fraction 0.25", flush=True)
runpy.run_path(sys.argv[1], run_name="__main__")
PY

cat > "$W/cudnn_late.py" <<'PY'
import os, sys, time, torch
x = torch.randn(16, 64, 256, 256, device="cuda", dtype=torch.float16)
w = torch.randn(128, 64, 3, 3, device="cuda", dtype=torch.float16)
open(sys.argv[1], "w").close()
print(f"context and inputs ready ({torch.cuda.memory_allocated() >> 20} MiB); waiting for the other process", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
print(f"free now {torch.cuda.mem_get_info()[0] >> 20} MiB; first convolution", flush=True)
y = torch.nn.functional.conv2d(x, w, padding=1)
torch.cuda.synchronize()
print("convolution done", flush=True)
PY

want() {  # NAME: is this scenario selected (SCENARIOS unset or naming it)?
  [ -z "${SCENARIOS:-}" ] || [[ " $SCENARIOS " == *" $1 "* ]]
}

run_case() {  # name seconds command...
  local name="$1" secs="$2"; shift 2
  want "$name" || return 0
  nvidia-smi dmon -s pucvmet -o DT -d 1 > "$C/gpu-h200-$name-dmon.txt" 2>&1 & local dp=$!
  "$PY" "$W/sampler.py" "$secs" "$C/gpu-h200-$name-nvml.csv" "$C/gpu-h200-$name-gpu-processes.csv" & local sp=$!
  sleep 1.5
  "$@" > "$C/gpu-h200-$name.log" 2>&1
  local rc=$?
  echo "$rc" > "$W/$name.rc"
  sleep 1.5
  kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null
  kill "$dp" 2>/dev/null; wait "$dp" 2>/dev/null
  echo "$name: exit $rc ($(($(date +%s) - START)) s so far)"
}

run_case graph-capture 30 timeout 60 "$PY" "$W/graph_capture.py"

other_case() {
  "$PY" "$W/hog.py" 0.8 25 & local hp=$!
  sleep 8
  timeout 60 "$PY" "$W/budget.py"
  local rc=$?
  kill "$hp" 2>/dev/null; wait "$hp" 2>/dev/null
  return $rc
}
run_case other-process 30 other_case

run_case runtime-growth 40 timeout 60 "$PY" "$W/runtime_growth.py"

full_card_case() {
  rm -f "$W/held"
  "$PY" "$W/hog_free.py" 64 "$W/held" 25 > "$W/hog-full-card.out" 2>&1 & local hp=$!
  for _ in $(seq 100); do [ -e "$W/held" ] && break; sleep 0.2; done
  timeout 60 "$PY" "$W/first_call.py"
  local rc=$?
  kill "$hp" 2>/dev/null; wait "$hp" 2>/dev/null
  return $rc
}
run_case full-card 30 full_card_case

late_case() {  # SCRIPT NAME: SCRIPT makes its context and inputs, then another process takes all but ~8 MiB
  rm -f "$W/ready" "$W/held"
  timeout 60 "$PY" "$W/$1" "$W/ready" "$W/held" & local bp=$!
  for _ in $(seq 100); do [ -e "$W/ready" ] && break; sleep 0.2; done
  "$PY" "$W/hog_free.py" 8 "$W/held" 25 > "$W/hog-$2.out" 2>&1 & local hp=$!
  wait "$bp"
  local rc=$?
  kill "$hp" 2>/dev/null; wait "$hp" 2>/dev/null
  return $rc
}
run_case cublas-full 30 late_case cublas_late.py cublas-full

run_case triton-full 30 timeout 90 "$PY" "$W/triton_full.py"

run_case async-growth 40 env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync timeout 60 "$PY" "$W/runtime_growth.py"
run_case expandable-growth 40 env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 60 "$PY" "$W/runtime_growth.py"
run_case fraction-growth 30 timeout 60 "$PY" "$W/fraction_growth.py" "$W/runtime_growth.py"

run_case cudnn-full 30 late_case cudnn_late.py cudnn-full

# Corpus metadata, then what triage says about each (JSON), for the report.
tel() { echo "telemetry = \"gpu-h200-$1-dmon.txt\""; echo "telemetry_nvml = \"gpu-h200-$1-nvml.csv\""; }
corpus_toml oom.sh graph-capture oom_cudagraph_capture "torch OutOfMemoryError raised inside torch.cuda.graph capture (torch/cuda/graphs.py in the traceback) with ~1 GiB free" "$(tel graph-capture)"
corpus_toml oom.sh other-process startup_free_memory_below_target "torch OOM reserving 0.9 x total while another process (listed by PyTorch, and in gpu-processes.csv) held ~80% of the card" "$(tel other-process)"
corpus_toml oom.sh runtime-growth oom_runtime_under_load "torch OOM after many steps of a growing batch/cache; memory plateaued at capacity in dmon/NVML" "$(tel runtime-growth)"
corpus_toml oom.sh full-card startup_free_memory_below_target "the first CUDA call of a process fails with 'CUDA error: out of memory' while another process (gpu-processes.csv) holds all but ~64 MiB of the card" "$(tel full-card)"
corpus_toml oom.sh cublas-full startup_free_memory_below_target "the first matmul (cuBLAS handle) fails for memory after another process (gpu-processes.csv) took all but ~8 MiB of the card" "$(tel cublas-full)"
corpus_toml oom.sh triton-full oom_runtime_under_load "this process's own allocations filled the card (no other process in gpu-processes.csv), then loading a Triton kernel for its first launch failed: 'Triton Error [CUDA]: out of memory' from the driver, outside PyTorch's allocator" "$(tel triton-full)"
corpus_toml oom.sh async-growth oom_runtime_under_load "the growing loop of runtime-growth under backend:cudaMallocAsync: the stream-ordered pool's OOM after many steps; memory plateaued at capacity in dmon/NVML" "$(tel async-growth)"
corpus_toml oom.sh expandable-growth oom_runtime_under_load "the growing loop of runtime-growth under expandable_segments:True: torch OOM after many steps; memory plateaued at capacity in dmon/NVML" "$(tel expandable-growth)"
corpus_toml oom.sh fraction-growth oom_runtime_under_load "the growing loop of runtime-growth under set_per_process_memory_fraction(0.25): torch OOM after many steps at the process's own limit, with most of the card free" "$(tel fraction-growth)"
corpus_toml oom.sh cudnn-full startup_free_memory_below_target "the first convolution (cuDNN handle and workspace) fails for memory after another process (gpu-processes.csv) took all but ~8 MiB of the card" "$(tel cudnn-full)"
for name in graph-capture other-process runtime-growth full-card cublas-full triton-full async-growth expandable-growth fraction-growth cudnn-full; do
  triage_case "$name" --telemetry "$C/gpu-h200-$name-dmon.txt"
done
pack oom "nvrm|xid|oom"

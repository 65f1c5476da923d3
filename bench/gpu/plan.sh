#!/usr/bin/env bash
# The planner on a real GPU host: what `gputune plan` sees (total and free memory, PCIe link, NUMA node)
# and plans, alone and while another process holds GPU memory (the plan must count it).
#
# Runs from the repository root on a GPU machine with python3 + torch + pynvml + psutil + rich + typer
# (no vLLM: the plan says which vLLM version it assumed). Read-only on the GPU: it never changes GPU
# settings; the only GPU work is a torch process that holds 20 GiB for a few seconds, then exits.
# Takes well under 3 minutes. Writes one tarball: $OUT/plan.tgz
set -u
OUT="${OUT:-$PWD/out}"
WORK="$(mktemp -d)"
mkdir -p "$OUT" "$WORK/plan"
D="$WORK/plan"
export PYTHONPATH=.
run() {  # run NAME CMD...: stdout, stderr, exit code and wall time of one command
    local name="$1"; shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >"$D/$name.out" 2>"$D/$name.err"
    echo $? >"$D/$name.rc"
    t1=$(date +%s.%N)
    python3 -c "print(f'{$t1 - $t0:.3f}')" >"$D/$name.seconds"
}

{ date -u; uname -a; python3 --version; nvidia-smi --query-gpu=name,memory.total,memory.used,memory.free,pcie.link.gen.max,pcie.link.width.max --format=csv; } >"$D/env.txt" 2>&1
nvidia-smi -q -x >"$D/nvidia-smi-before.xml" 2>/dev/null
git rev-parse HEAD >"$D/commit.txt" 2>/dev/null

# 1. the real card, each built-in profile, JSON and text
for m in qwen72b-gptq qwen2.5-72b-awq llama3-70b-awq llama3-70b-fp8 llama3-8b qwen2.5-7b; do
    run "live-$m" python3 -m tuner plan --model "$m" --format json
done
run live-qwen72b-gptq-text python3 -m tuner plan --model qwen72b-gptq
run live-user-args python3 -m tuner plan --model qwen72b-gptq --format json -- --gpu-memory-utilization 0.95 --max-model-len 16384
run live-list python3 -m tuner plan --list-models

# 2. another process holds 20 GiB of this GPU: the plan must see less free memory and cap utilization
python3 - <<'PY' >"$D/holder.log" 2>&1 &
import time, torch
x = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
open("/tmp/gputune-plan-holder.ready", "w").close()
time.sleep(40)
PY
HOLDER=$!
for _ in $(seq 1 60); do [ -f /tmp/gputune-plan-holder.ready ] && break; kill -0 "$HOLDER" 2>/dev/null || break; sleep 1; done
nvidia-smi --query-gpu=memory.used,memory.free --format=csv >"$D/held-nvidia-smi.csv" 2>&1
run held-qwen72b-gptq python3 -m tuner plan --model qwen72b-gptq --format json
run held-user-util python3 -m tuner plan --model qwen72b-gptq --format json -- --gpu-memory-utilization 0.95
kill "$HOLDER" 2>/dev/null; wait "$HOLDER" 2>/dev/null
rm -f /tmp/gputune-plan-holder.ready

# 3. the tiers for comparison (same code path, sizes given)
for s in 24GiB 48GiB 80GiB 141GiB 8GiB; do
    run "tier-$s" python3 -m tuner plan --model qwen72b-gptq --gpu-mem "$s" --format json
done

# 4. plan timing on this machine
run bench python3 bench/plan.py

tar -C "$WORK" -czf "$OUT/plan.tgz" plan
echo "wrote $OUT/plan.tgz"

#!/usr/bin/env bash
# Capture nvidia-smi's process table with two processes holding memory on one GPU (what users paste into
# their crash reports when a second engine shares the card), for triage's table reader.
#
#   OUT=/some/dir bash bench/gpu/process-table.sh   # from the repository root; < 1 minute
#
# Writes $OUT/nvidia-smi.txt (the plain `nvidia-smi` screen) and $OUT/compute-apps.csv, taken while two
# PyTorch processes hold 20 GiB and 8 GiB on GPU 0. Read-only on the GPU's settings.
set -u
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
hold() {  # hold GIB SECONDS: allocate GIB on GPU 0 and keep it
  "$PY" -c "import torch,time,sys; x=torch.empty(int($1*2**30),dtype=torch.uint8,device='cuda:0'); \
print('holding', $1, 'GiB', flush=True); time.sleep($2)" &
}
hold 20 40; A=$!
hold 8 40; B=$!
for _ in $(seq 60); do  # until both show in the table
  [ "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 2>/dev/null | grep -cE "^($A|$B)$")" = 2 ] && break
  sleep 0.5
done
sleep 2
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv > "$OUT/compute-apps.csv" 2>&1
kill "$A" "$B" 2>/dev/null
wait
echo "holders were pids $A $B"
cat "$OUT/nvidia-smi.txt"

#!/usr/bin/env bash
# The telemetry recorder beside `nvidia-smi dmon` on a real GPU, during a PyTorch workload that
# allocates and frees GPU memory in steps (~50 s). Read-only on the GPU: no setting is changed.
#
# Run from the repository root on the GPU machine (python3 + torch + pynvml + psutil, no vLLM):
#   OUT=/some/dir bash bench/gpu/telemetry.sh
# Writes ONE tarball, $OUT/telemetry.tgz, holding:
#   dmon.txt          nvidia-smi dmon -s pucvmet -o DT -d 1, run with TZ=UTC (its clock is UTC)
#   rec10/            python -m tuner.telemetry record --interval 0.1 (telemetry.csv, events.jsonl, summary.json)
#   rec1/             the same at --interval 1 (the launch default)
#   workload.jsonl    each allocation step: {"time", "label", "allocated_mib"}
#   cpu.json          CPU seconds and % of one core of dmon and of each recorder over its wall time
#   meta.json         GPU name and memory, driver, python/torch versions, UTC offset
# tests/test_telemetry_gpu.py reads these (place them at tests/fixtures/gpu/telemetry/).
set -euo pipefail

OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DURATION=170  # a cap: the recorders are stopped (SIGTERM) 3 s after the workload ends

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$WORK/nvidia-smi-query.txt" || true

# 1. dmon at its fastest (1 s), its clock in UTC so the timelines compare without time zones.
TZ=UTC nvidia-smi dmon -s pucvmet -o DT -d 1 > "$WORK/dmon.txt" 2> "$WORK/dmon.err" &
DMON=$!
# 2. the recorder at 10 Hz and at 1 Hz, each its own process
python3 -m tuner.telemetry record --out "$WORK/rec10" --interval 0.1 --duration "$DURATION" \
    > "$WORK/rec10.summary.json" 2> "$WORK/rec10.err" &
REC10=$!
python3 -m tuner.telemetry record --out "$WORK/rec1" --interval 1 --duration "$DURATION" \
    > "$WORK/rec1.summary.json" 2> "$WORK/rec1.err" &
REC1=$!
sleep 2

# 3. the workload: 4 steps of +12 GiB, a matmul burst, then 4 steps of -12 GiB
python3 - "$WORK/workload.jsonl" <<'PY' > "$WORK/workload.log" 2>&1
import json, sys, time
import torch

out = open(sys.argv[1], "w")
def mark(label):
    torch.cuda.synchronize()
    rec = {"time": time.time(), "label": label, "allocated_mib": torch.cuda.memory_reserved() >> 20}
    out.write(json.dumps(rec) + "\n"); out.flush()

torch.cuda.init()
mark("start")
time.sleep(3)
bufs = []
for i in range(4):  # up in 12 GiB steps, each held 5 s
    bufs.append(torch.ones(12 << 30, dtype=torch.uint8, device="cuda"))
    mark(f"+12GiB #{i + 1}")
    time.sleep(5)
x = torch.randn(8192, 8192, device="cuda")
mark("matmul begin")
t = time.time()
while time.time() - t < 4:
    y = x @ x
torch.cuda.synchronize()
del x, y
torch.cuda.empty_cache()
mark("matmul end")
time.sleep(3)
for i in range(4):  # down again, each level held 4 s
    bufs.pop()
    torch.cuda.empty_cache()
    mark(f"-12GiB #{i + 1}")
    time.sleep(4)
mark("end")
PY

sleep 3
kill -TERM "$REC10" "$REC1" 2>/dev/null || true
wait "$REC10" "$REC1" || true
# 4. dmon's CPU time over its life, read just before it is stopped
python3 - "$DMON" "$WORK" <<'PY'
import json, sys, time
import psutil
pid, work = int(sys.argv[1]), sys.argv[2]
p = psutil.Process(pid)
ct = p.cpu_times()
wall = time.time() - p.create_time()
cpu = ct.user + ct.system + ct.children_user + ct.children_system
res = {"dmon": {"cpu_s": round(cpu, 4), "wall_s": round(wall, 3), "cpu_percent_of_one_core": round(100 * cpu / wall, 3),
                "interval_s": 1.0}}
for name in ("rec10", "rec1"):
    try:
        s = json.load(open(f"{work}/{name}.summary.json"))
        res[name] = {k: s.get(k) for k in ("cpu_s", "cpu_s_children", "wall_s", "cpu_percent_of_one_core", "interval_s", "samples", "gpus")}
    except (OSError, ValueError) as exc:
        res[name] = {"error": str(exc)}
json.dump(res, open(f"{work}/cpu.json", "w"), indent=2)
print(json.dumps(res, indent=2))
PY
kill "$DMON" 2>/dev/null || true
wait "$DMON" 2>/dev/null || true

python3 - "$WORK" <<'PY'
import json, platform, sys, time
import torch
work = sys.argv[1]
meta = {
    "python": platform.python_version(),
    "torch": torch.__version__,
    "gpu": torch.cuda.get_device_name(0),
    "utc_offset_s": time.localtime().tm_gmtoff,
    "nvidia_smi": open(f"{work}/nvidia-smi-query.txt").read().strip(),
    "made_at": time.time(),
}
json.dump(meta, open(f"{work}/meta.json", "w"), indent=2)
PY

tar czf "$OUT/telemetry.tgz" -C "$WORK" .
echo "wrote $OUT/telemetry.tgz"

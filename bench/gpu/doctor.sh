#!/usr/bin/env bash
# Run `gputune doctor` and `gputune snapshot` for real on a GPU machine and pack what they said.
#
# Usage, from the repository root:  OUT=/some/dir bash bench/gpu/doctor.sh   -> $OUT/doctor.tgz
# Needs python3 with typer, rich, psutil, nvidia-ml-py (torch for the load re-test); nothing is
# installed. Read-only on the GPU: it changes no GPU setting; the only load is ~1 s of matmuls
# (the --under-load re-test). Takes well under 3 minutes.
#
# What to commit from doctor.tgz (see the file list in summary.txt):
#   h200-snapshot.tar.gz           -> tests/fixtures/gpu/h200-snapshot.tar.gz
#   h200-snapshot.expected.json    -> tests/fixtures/gpu/h200-snapshot.expected.json
#   the rest (live reports, timings, comparison) -> tests/fixtures/gpu/doctor/
set -u
OUT=${OUT:?set OUT to the folder for doctor.tgz}
W=$(mktemp -d /tmp/gputune-doctor-XXXXXX)
export PYTHONPATH=.
PY=${PYTHON:-python3}
S=$W/summary.txt
: > "$S"

step() {  # step NAME CMD...: stdout -> NAME.out, stderr -> NAME.err, exit code and seconds -> summary
  local name=$1; shift
  local t0 t1
  t0=${EPOCHREALTIME:-$(date +%s.%N)}
  timeout 150 "$@" > "$W/$name.out" 2> "$W/$name.err"
  local rc=$?
  t1=${EPOCHREALTIME:-$(date +%s.%N)}
  printf '%-22s rc=%-3s %6s s  %s\n' "$name" "$rc" "$(awk "BEGIN{printf \"%.2f\", $t1 - $t0}")" "$*" >> "$S"
}

{
  echo "== host"; uname -a; nvidia-smi -L 2>&1; "$PY" --version
  "$PY" -c 'import importlib.metadata as m
for n in ("torch","nvidia-ml-py","typer","rich","psutil","pyudev","vllm"):
    try: print(n, m.version(n))
    except m.PackageNotFoundError: print(n, "absent")'
} > "$W/host.txt" 2>&1

# Byte-compile the package as pip does at install: a copied checkout may have no __pycache__, and
# PYTHONDONTWRITEBYTECODE would then make every run below compile it again.
"$PY" -m compileall -q tuner > "$W/compileall.out" 2>&1

step doctor-table        "$PY" -m tuner doctor
step doctor-verbose      "$PY" -m tuner doctor -v
step doctor-json         "$PY" -m tuner doctor --format json
step snapshot            "$PY" -m tuner snapshot -o "$W/h200-snapshot.tar.gz"
step doctor-from-json    "$PY" -m tuner doctor --from "$W/h200-snapshot.tar.gz" --format json
step doctor-from-table   "$PY" -m tuner doctor --from "$W/h200-snapshot.tar.gz" -v
step under-load-json     "$PY" -m tuner doctor --under-load --format json
step under-load-table    "$PY" -m tuner doctor --under-load --only pcie.link -v
step importtime          "$PY" -X importtime -m tuner doctor --format json
step profile             "$PY" -m cProfile -s cumtime -m tuner doctor --format json
cp "$W/doctor-from-json.out" "$W/h200-snapshot.expected.json"

# The load re-test for real: the H200 idles at its max generation, so the doctor never needs the
# load there; call it directly and read the link while it runs.
step load-retest "$PY" - <<'PYEOF'
import json, time
from tuner.gpu import read_gpus, read_pcie_nvml
from tuner.host import Host
from tuner.probes.pcie import read_sysfs_link, run_load
host = Host.live_host()
inv = read_gpus(host)
before = [(g.index, read_pcie_nvml(g.index), read_sysfs_link(host, g.pci_bus_id)) for g in inv.gpus]
during = []
t0 = time.perf_counter()
ran, tool, reason = run_load(inv.gpus[:1], lambda: during.extend(
    (g.index, read_pcie_nvml(g.index), read_sysfs_link(host, g.pci_bus_id)) for g in inv.gpus[:1]))
print(json.dumps({"ran": ran, "tool": tool, "reason": reason, "seconds": round(time.perf_counter() - t0, 2),
                  "before": repr(before), "during": repr(during)}, indent=1))
PYEOF

# Live and offline reports must agree check by check.
step compare "$PY" - "$W/doctor-json.out" "$W/doctor-from-json.out" <<'PYEOF'
import json, sys
live, snap = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda c: (c["id"], c.get("subject"), c["status"])
a, b = [key(c) for c in live["checks"]], [key(c) for c in snap["checks"]]
for x, y in zip(a, b):
    print("same" if x == y else "DIFF", x, y)
print("IDENTICAL" if a == b else "DIFFERENT")
sys.exit(0 if a == b else 1)
PYEOF

# Timing: doctor against torch's collect_env in the same run (bench/doctor.py when present).
# Twice: as the environment is (site-packages may lack bytecode: then every run of either command
# compiles it), and with a private bytecode cache for both, as on a host that compiled at install.
if [ -f bench/doctor.py ]; then
  step bench-doctor "$PY" bench/doctor.py
  PYC=$(mktemp -d /tmp/gputune-pyc-XXXXXX)
  step bench-doctor-pycache "$PY" bench/doctor.py --pycache-prefix "$PYC"
  rm -rf "$PYC"
else
  for i in 1 2 3 4 5; do step "doctor-time-$i" "$PY" -m tuner doctor --format json; done
  step collect-env "$PY" -m torch.utils.collect_env
fi

ls -la "$W" >> "$S"
tar czf "$OUT/doctor.tgz" -C "$W" .
cat "$S"
echo "== compare"; tail -3 "$W/compare.out"
echo "== doctor"; cat "$W/doctor-table.out"

#!/usr/bin/env bash
# `gputune tune` on a real GPU host, changing nothing on it:
#  1. dry runs on the live host (table, JSON, --persist): what tune would change, the GPU commands
#     it prints for the operator (persistence mode, ...) from real NVML, the doctor's manual steps;
#  2. apply / verify / revert against a COPY of this host's tunable files (a tree under $work),
#     checked byte-identical afterwards (as root only; skipped otherwise).
# Never writes /proc, /sys or /etc of this host and never runs nvidia-smi with a setting.
# Run from the repository root; writes one tarball: $OUT/tune.tgz. Takes a few seconds.
set -u
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
work=$(mktemp -d)
res="$work/tune"
mkdir -p "$res"
gt() { PYTHONPATH=. timeout 60 python3 -m tuner "$@"; }

{
  date -u +%FT%TZ
  uname -a
  id
  python3 --version
} >"$res/env.txt" 2>&1

gt tune >"$res/dry-run.txt" 2>"$res/dry-run.err"; echo $? >"$res/dry-run.rc"
gt tune --format json >"$res/dry-run.json" 2>"$res/dry-run-json.err"; echo $? >"$res/dry-run-json.rc"
gt tune --persist --format json >"$res/dry-run-persist.json" 2>"$res/dry-run-persist.err"
echo $? >"$res/dry-run-persist.rc"
gt doctor --format json >"$res/doctor.json" 2>"$res/doctor.err"; echo $? >"$res/doctor.rc"

# A tree holding copies of the files tune reads, at their host paths.
tree="$work/tree"
copy() { for p in "$@"; do [ -r "$p" ] || continue; mkdir -p "$tree$(dirname "$p")"; cat "$p" >"$tree$p" 2>/dev/null; done; }
copy /proc/sys/vm/swappiness /proc/sys/vm/max_map_count /proc/sys/vm/overcommit_memory \
  /proc/sys/vm/zone_reclaim_mode /proc/sys/kernel/numa_balancing /proc/swaps \
  /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
for d in /sys/devices/system/node/node[0-9]*; do [ -d "$d" ] && mkdir -p "$tree$d"; done
for g in /sys/devices/system/cpu/cpu[0-9]*/cpufreq; do
  [ -d "$g" ] && copy "$g/scaling_governor" "$g/scaling_available_governors"
done
(cd "$tree" && find . -type f | sort | xargs -r sha256sum) >"$res/tree-before.sha256"
gt tune --root "$tree" --format json >"$res/tree-dry-run.json" 2>"$res/tree-dry-run.err"
if [ "$(id -u)" = 0 ]; then
  gt tune --root "$tree" --apply --persist --format json >"$res/tree-apply.json" 2>"$res/tree-apply.err"
  echo $? >"$res/tree-apply.rc"
  gt tune --root "$tree" --revert --format json >"$res/tree-revert.json" 2>"$res/tree-revert.err"
  echo $? >"$res/tree-revert.rc"
  (cd "$tree" && find . -type f | sort | xargs -r sha256sum) >"$res/tree-after.sha256"
  if diff -q "$res/tree-before.sha256" "$res/tree-after.sha256" >/dev/null; then
    echo identical >"$res/tree-roundtrip.txt"
  else
    diff "$res/tree-before.sha256" "$res/tree-after.sha256" >"$res/tree-roundtrip.txt"
  fi
else
  echo "not root: tree apply/revert skipped" >"$res/tree-roundtrip.txt"
fi
tar -C "$work" -czf "$OUT/tune.tgz" tune
rm -rf "$work"
echo "wrote $OUT/tune.tgz"

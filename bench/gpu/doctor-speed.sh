#!/usr/bin/env bash
# Time `gputune doctor` on a GPU machine against `python -m torch.utils.collect_env`, and say where
# its time goes. Read-only: no GPU setting is changed and no load is put on the GPU.
#
# Usage, from the repository root:  OUT=/some/dir bash bench/gpu/doctor-speed.sh   -> $OUT/doctor-speed.tgz
# Needs python3 with typer, psutil, nvidia-ml-py (and torch for the baseline); nothing is installed.
# Takes about a minute (collect_env runs 4 times per bench, twice over).
#
# The tarball holds (put them under tests/fixtures/gpu/doctor-speed/):
#   host.txt                     machine, Python and package versions, load average
#   bench.out/.err               bench/doctor.py as the environment is: tuner/ byte-compiled first;
#                                site-packages as installed (it says which imported modules lack bytecode)
#   bench-pycache.out/.err       the same with a private bytecode cache for both commands (as on a host
#                                whose packages were compiled at install)
#   importtime.err               python -X importtime -m tuner doctor --format json (tuner/ compiled)
#   profile.out                  python -m cProfile -s cumtime -m tuner doctor --format json
set -u
OUT=${OUT:?set OUT to the folder for doctor-speed.tgz}
W=$(mktemp -d /tmp/gputune-doctor-speed-XXXXXX)
PYC=$(mktemp -d /tmp/gputune-pyc-XXXXXX)
export PYTHONPATH=.
PY=${PYTHON:-python3}

{
  echo "== host"; uname -a; nvidia-smi -L 2>&1; "$PY" --version; nproc; cat /proc/loadavg
  echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}"
  "$PY" -c 'import importlib.metadata as m
for n in ("torch","nvidia-ml-py","typer","pydantic","rich","psutil","vllm"):
    try: print(n, m.version(n))
    except m.PackageNotFoundError: print(n, "absent")'
} > "$W/host.txt" 2>&1

"$PY" -m compileall -q tuner > "$W/compileall.out" 2>&1
timeout 60 "$PY" -X importtime -m tuner doctor --format json > "$W/importtime.out" 2> "$W/importtime.err"
timeout 60 "$PY" -m cProfile -s cumtime -m tuner doctor --format json > "$W/profile.out" 2>&1
timeout 150 "$PY" bench/doctor.py > "$W/bench.out" 2> "$W/bench.err"
timeout 150 "$PY" bench/doctor.py --pycache-prefix "$PYC" > "$W/bench-pycache.out" 2> "$W/bench-pycache.err"
rm -rf "$PYC"
cat /proc/loadavg >> "$W/host.txt"

tar czf "$OUT/doctor-speed.tgz" -C "$W" .
cat "$W/host.txt" "$W/bench.out" "$W/bench-pycache.out"

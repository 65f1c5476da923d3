# Shared by the bench/gpu scripts that make real failures for tests/corpus (oom.sh, failures.sh).
# Source it from the repository root after `set -u`; it sets OUT, W (work dir), C (corpus dir), PY, START.
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
W="$(mktemp -d)"
C="$W/corpus"
mkdir -p "$C"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off (shared machines): NCCL, PyTorch and NVSHMEM
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
START=$(date +%s)

# corpus_toml SCRIPT NAME LABEL EVIDENCE [TOML_LINE ...]: the metadata of a scenario's log in tests/corpus
# layout (the label the scenario was built to produce and what in the log shows it); nothing when the
# scenario did not run
corpus_toml() {
  local script="$1" name="$2" label="$3" evidence="$4"; shift 4
  [ -f "$W/$name.rc" ] || return 0
  {
    echo "# Real failure on NVIDIA H200s made by bench/gpu/$script (torch / Triton / NCCL only, no vLLM)."
    echo "source = \"generated: H200, bench/gpu/$script scenario $name, torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)\""
    echo "label = \"$label\""
    echo 'stage = ""'
    echo "evidence = \"$evidence\""
    for line in "$@"; do echo "$line"; done
    echo "exit_code = $(cat "$W/$name.rc")"
  } > "$C/gpu-h200-$name.toml"
}

# triage_case NAME [TRIAGE_ARG ...]: what gputune triage says of a scenario's log, as JSON in $W
triage_case() {
  local name="$1"; shift
  [ -f "$W/$name.rc" ] || return 0
  "$PY" -m tuner triage "$C/gpu-h200-$name.log" "$@" --exit-code "$(cat "$W/$name.rc")" --format json \
    > "$W/triage-$name.json" 2> "$W/triage-$name.err"
  echo "triage $name -> $("$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['cause'], d['confidence'])" "$W/triage-$name.json" 2>/dev/null)"
}

# pack NAME KERNEL_REGEX: the GPU's name and driver, the kernel log's matching lines, and everything the
# scenarios left in $W, as $OUT/NAME.tgz
pack() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$W/gpu.csv" 2>&1
  (dmesg 2>/dev/null | tail -n 200 | grep -iE "$2" > "$W/dmesg-tail.txt") || true
  echo "total $(($(date +%s) - START)) s"
  tar czf "$OUT/$1.tgz" -C "$W" corpus gpu.csv dmesg-tail.txt $(cd "$W" && ls triage-*.json triage-*.err *.rc)
  rm -rf "$W"
  echo "wrote $OUT/$1.tgz"
}

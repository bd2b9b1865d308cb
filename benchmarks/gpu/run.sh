#!/usr/bin/env bash
# The GPU benchmark as one prepared script (see bench.py). On a GPU server with trainwise installed:
#   benchmarks/gpu/run.sh            -> benchmarks/results/gpu.json
#   benchmarks/gpu/run.sh --dry-run  -> tiny sizes on the CPU, benchmarks/results/gpu_dry_run.json
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PY" benchmarks/gpu/bench.py "$@"

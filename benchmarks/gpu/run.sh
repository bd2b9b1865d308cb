#!/usr/bin/env bash
# The GPU benchmark as one prepared script (see bench.py). On a GPU server with trainwise installed:
#   benchmarks/gpu/run.sh            -> benchmarks/results/gpu.json
#   benchmarks/gpu/run.sh --dry-run  -> tiny sizes on the CPU, benchmarks/results/gpu_dry_run.json
# The interpreter: $PYTHON when given, else the one the `trainwise` on PATH runs in (a conda env, a CI venv,
# this checkout's .venv when it is activated), else python3 -- never a guess that may lack torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
interpreter_of_trainwise() {
  local script
  script="$(command -v trainwise)" || return 1
  # a pip-installed console script starts with "#!/path/to/python"
  head -n 1 "$script" | sed -n 's/^#![[:space:]]*\([^[:space:]]*python[^[:space:]]*\).*/\1/p'
}
PY="${PYTHON:-}"
[ -n "$PY" ] || PY="$(interpreter_of_trainwise || true)"
[ -n "$PY" ] || PY=python3
exec "$PY" benchmarks/gpu/bench.py "$@"

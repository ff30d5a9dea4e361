#!/usr/bin/env bash
# One entry point that sets everything up on a fresh machine, then runs:
#   ./dev.sh demo [args]   the image demo on the embedded default image (GPU if present, else CPU)
#   ./dev.sh test [args]   the test suite (CPU backend; TINN_ARCH=cuda for the GPU, -m "not slow" for a quick pass)
#   ./dev.sh bench [args]  the MLP-array benchmark (python -m benchmarks.bench_mlp_array; every suite: python -m benchmarks list)
# TINN_BACKEND=quadrants (or taichi) picks the kernel backend; setup installs it when missing.
set -euo pipefail
cd "$(dirname "$0")"
VENV=${TINN_VENV:-.venv}
PY=${PYTHON:-python3}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  # torch first and pinned: a loose requirement could pull a multi-GB build.
  "$VENV/bin/python" -c "import torch" 2>/dev/null || "$VENV/bin/pip" install -q "torch==${TINN_TORCH_VERSION:-2.13.0}"
  local extras=test
  case "${TINN_BACKEND:-auto}" in taichi|quadrants) extras="test,$TINN_BACKEND" ;; esac
  "$VENV/bin/python" -c "import os, imageio, pytest, xdist, tinn.backend as b; b.resolve(None, os.environ.get(b.ENV))" 2>/dev/null \
    || "$VENV/bin/pip" install -q -e ".[$extras]"
}

cmd=${1:-}
shift || true
case "$cmd" in
  demo)  setup; exec "$VENV/bin/python" demos/mlp_learning_an_image.py "$@" ;;
  test)  setup; TINN_ARCH=${TINN_ARCH:-cpu} exec "$VENV/bin/python" -m pytest -q "$@" ;;
  bench) setup; exec "$VENV/bin/python" -m benchmarks.bench_mlp_array "$@" ;;
  setup) setup ;;
  *) echo "usage: ./dev.sh {demo|test|bench|setup} [args]" >&2; exit 2 ;;
esac

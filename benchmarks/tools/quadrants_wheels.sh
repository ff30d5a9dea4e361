#!/usr/bin/env bash
# Quadrants and its dependencies as wheels for an offline Python 3.12 machine (the GPU machines), in .whlq/
# of this checkout (git-ignored). Carry .whlq alone (Taichi's wheel next to it would pass the carry limit)
# and begin the device command with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/siteq .whlq/*.whl && \
#     export PYTHONPATH=/tmp/siteq:$PYTHONPATH && export TINN_BACKEND=quadrants
# e.g. then: ARCHIVE=$OUT/q.tgz OUT=/tmp/q SPEED_PARTS="bench" bash benchmarks/gpu_suite.sh speed
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.whlq/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.whlq/' >> .git/info/exclude; }
# Its dependencies but numpy, which the GPU machines' torch environment has (and which would pass the limit).
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whlq "quadrants==${QUADRANTS_VERSION:-1.4.0}" colorama dill pydantic rich setuptools cffi
rm -f .whlq/numpy-*.whl
du -sh .whlq

"""Triton kernels compiled for the GPU on a machine without one: Triton's CPU interpreter, which runs the other
tests' Triton paths, accepts code the GPU compiler refuses, so each kernel family is also compiled to a GPU binary
here (Triton's bundled ptxas), in a process without TRITON_INTERPRET."""
import os
import subprocess
import sys

import pytest

from tinn.kernels import triton_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_triton_kernels_compile_for_sm90():
    """The grid's kernels in every variant of the tool, Adam's, the gradient scaler's, compositing's and the image
    task's batch sampler."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.tools.triton_compile", "--arch", "90"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert run.stdout.count("ok grid _grid_") == 23 and "0 failed" in run.stdout
    # The vector-reduction table gradient (2, 4 and 8 features; with two, also adding corner pairs in four-word
    # reductions) and the sum of its private copies. Each with the sm_90 vector reductions in its PTX (not the
    # scalar atomics of the interpreter's stand-in).
    assert run.stdout.count("ok grid _grid_backward_vector") == 9 and "ok grid _sum_private" in run.stdout
    assert run.stdout.count("vector reductions 0") == 0 and run.stdout.count("vector reductions") == 9
    pairs = [line for line in run.stdout.splitlines() if line.startswith("ok grid _grid_backward_vector")
             and " pairs:" in line]
    assert len(pairs) == 3 and all("vector reductions 0" not in line for line in pairs), pairs
    assert "ok adam adam_kernel" in run.stdout
    assert "ok scaler record_kernel" in run.stdout and "ok scaler update_kernel" in run.stdout
    assert run.stdout.count("ok render _") == 4
    assert run.stdout.count("ok image _sample_kernel") == 2


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed")
def test_tensor_core_kernels_compile_for_sm90():
    """The tensor-core MLP kernels at the benchmark's shape in every precision (forward for training and inference,
    the backward, the backward that recomputes the forward with the loss inside, and the forward and recomputing
    backward on a grid's feature-major output with its input gradient), within sm_90's shared memory."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.tools.tensor_core_compile", "--quick"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert len(lines) == 24 and all(line.startswith("ok") for line in lines), "\n".join(lines)

"""benchmarks/tools/reduce_pieces_ab.py over two CPU ranks (gloo): its results' shape and its refusal of bad values."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, *args, timeout=300):
    env = dict(os.environ, TINN_ARCH="cpu", TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
           "-m", "benchmarks.tools.reduce_pieces_ab", "--out", str(tmp_path / "ab.json"), *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_tool_alternates_the_pieces_values_and_reports_each(tmp_path):
    """Two rounds of 1 and 4 ranges of the all-reduce on the tensor-core array (Triton's interpreter): every round
    timed for every value, ratios that are the one-GPU times over the medians."""
    done = _run(tmp_path, "--batches", "256", "--networks", "6", "--reps", "1", "--rounds", "2", "--pieces", "1,4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.load(open(tmp_path / "ab.json"))
    assert record["world"] == 2 and record["split"] is False
    (row,) = record["results"]
    assert row["batch"] == 256 and set(row["two_gpu_ms"]) == {"1", "4"}
    for k, ms in row["two_gpu_ms"].items():
        assert len(row["rounds_ms"][k]) == 2 and min(row["rounds_ms"][k]) <= ms <= max(row["rounds_ms"][k])
        assert row["strong"][k] == pytest.approx(row["one_gpu_ms"] / ms)
        assert row["same_array_weak"][k] == pytest.approx(row["one_gpu_half_ms"] / ms)
    assert "pieces" in done.stdout


def test_bad_values_are_refused_by_name(tmp_path):
    done = _run(tmp_path, "--pieces", "0,4", timeout=120)
    assert done.returncode != 0 and "--pieces take positive integers" in done.stderr

"""benchmarks/tools/replicated_ab.py over two CPU ranks (gloo): its results' shape and its refusal of bad values."""
from __future__ import annotations

import json

import pytest

from tool_ranks import run_tool  # noqa: E402  (tests/ is on sys.path under pytest)


def _run(tmp_path, *args, timeout=300):
    return run_tool("benchmarks.tools.replicated_ab", "--out", str(tmp_path / "ab.json"), *args, timeout=timeout)


@pytest.mark.slow
def test_the_tool_alternates_the_variants_and_reports_each(tmp_path):
    """Two rounds of two tunings (the all-reduce in 1 and in 4 ranges) on the tensor-core array (Triton's
    interpreter): every round timed for every variant, ratios that are the one-GPU times over the medians."""
    done = _run(tmp_path, "--batches", "256", "--networks", "6", "--reps", "1", "--rounds", "2",
                "--variants", "reduce_pieces=1;reduce_pieces=4,replicated_step_graphs=true")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.load(open(tmp_path / "ab.json"))
    assert record["world"] == 2 and record["split"] is False
    (row,) = record["results"]
    variants = ["reduce_pieces=1", "reduce_pieces=4,replicated_step_graphs=true"]
    assert row["batch"] == 256 and list(row["two_gpu_ms"]) == variants
    assert row["step_graphs"] == dict.fromkeys(variants, "steps issued op by op")  # the CPU: no graphs
    for k, ms in row["two_gpu_ms"].items():
        assert len(row["rounds_ms"][k]) == 2 and min(row["rounds_ms"][k]) <= ms <= max(row["rounds_ms"][k])
        assert row["strong"][k] == pytest.approx(row["one_gpu_ms"] / ms)
        assert row["same_array_weak"][k] == pytest.approx(row["one_gpu_half_ms"] / ms)
    assert "reduce_pieces=4,replicated_step_graphs=true" in done.stdout


def test_bad_values_are_refused_by_name(tmp_path):
    done = _run(tmp_path, "--variants", "reduce_pieces=1;reduce_pieces=0", timeout=120)
    assert done.returncode != 0 and "--variants" in done.stderr and "reduce_pieces" in done.stderr
    done = _run(tmp_path, "--batches", "0", timeout=120)
    assert done.returncode != 0 and "--batches takes positive integers" in done.stderr

"""benchmarks/bench_mlp_array.py at toy size: both timings of every training step, and ratios made from them."""

import pytest

from benchmarks import bench_mlp_array


def test_a_case_reports_synced_and_pipelined_steps():
    row = bench_mlp_array.bench_case(4, 10, 16, 8, 3, 1, "ragged", reps=2, skip_torch=False, vmap=False)
    for prefix in ("tinn", "torch"):
        assert row[f"{prefix}_train_ms"] > 0 and row[f"{prefix}_train_pipelined_ms"] > 0
        low, high = row[f"{prefix}_train_pipelined_spread_ms"]
        assert low <= row[f"{prefix}_train_pipelined_ms"] <= high  # the median of the blocks lies within them
        assert row[f"{prefix}_train_pipelined_spread_pct"] == pytest.approx(
            100 * (high - low) / row[f"{prefix}_train_pipelined_ms"])
    assert row["train_speedup"] == pytest.approx(row["torch_train_ms"] / row["tinn_train_ms"])
    assert row["train_speedup_pipelined"] == pytest.approx(row["torch_train_pipelined_ms"]
                                                           / row["tinn_train_pipelined_ms"])

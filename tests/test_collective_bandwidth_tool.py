"""benchmarks/tools/collective_bandwidth.py over two CPU ranks (gloo): every collective checked on known values and
timed, bus bandwidths by nccl-tests' convention, and its refusal of bad values."""
from __future__ import annotations

import json

import pytest

from tool_ranks import run_tool  # noqa: E402  (tests/ is on sys.path under pytest)


def _run(tmp_path, *args):
    return run_tool("benchmarks.tools.collective_bandwidth", "--out", str(tmp_path / "c.json"), *args, timeout=180)


def test_every_collective_is_timed_with_its_bus_bandwidth(tmp_path):
    done = _run(tmp_path, "--mbytes", "0.0012,0.004", "--dtypes", "float32,bfloat16", "--reps", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.load(open(tmp_path / "c.json"))
    assert record["backend"] == "gloo" and record["world_size"] == 2 and record["nccl_version"] is None
    rows = record["rows"]
    assert [(r["op"], r["dtype"]) for r in rows[:6]] == [
        (op, dtype) for dtype in ("float32", "bfloat16") for op in ("reduce_scatter", "all_gather", "all_reduce")]
    assert len(rows) == 12
    # 1200 bytes of float32 split over two ranks: 150 elements a rank; bfloat16: 300.
    assert [r["buffer_bytes"] for r in rows[:6]] == [1200] * 6
    for r in rows:
        factor = 1.0 if r["op"] == "all_reduce" else 0.5   # 2 (w - 1) / w and (w - 1) / w at w = 2
        assert r["ms"] > 0
        assert r["bus_gb_s"] == pytest.approx(r["buffer_bytes"] * factor / (r["ms"] * 1e-3) / 1e9)
    assert "reduce_scatter" in done.stdout and record["label"] in done.stdout


def test_bad_values_are_refused_by_name(tmp_path):
    done = _run(tmp_path, "--dtypes", "float32,int8")
    assert done.returncode != 0 and "--dtypes" in done.stderr and "int8" in done.stderr
    done = _run(tmp_path, "--mbytes", "0")
    assert done.returncode != 0 and "--mbytes takes positive sizes" in done.stderr

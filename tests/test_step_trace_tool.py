"""benchmarks/tools/sharded_step_trace.py reads a profiler timeline the way its tables say (busy time per stream, and
on the compute stream the gaps where the device waited for the host told apart from the others), and runs its
variants over two ranks."""
import json
import subprocess
import sys

import pytest

from benchmarks.tools.sharded_step_trace import summarise
from tool_ranks import ROOT, run_tool  # noqa: E402  (tests/ is on sys.path under pytest)


def _kernel(stream, ts, dur, correlation, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"stream": stream, "correlation": correlation}}


def _launch(ts, correlation):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2,
            "args": {"correlation": correlation}}


def test_the_summary_tells_host_bound_gaps_from_the_others():
    events = [
        # compute stream 7: three kernels; the second launched 30 us after the first ended (the device waited for
        # the host for 30 of its 50 us gap), the third launched long before its turn (a 20 us wait on something else)
        _launch(0, 1), _kernel(7, 10, 100, 1, "first"),
        _launch(140, 2), _kernel(7, 160, 40, 2, "second"),
        _launch(150, 3), _kernel(7, 220, 80, 3, "third"),
        # a collective on another stream
        _launch(5, 4), _kernel(16, 50, 60, 4, "nccl"),
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 1, "dur": 1, "args": {}},
    ]
    out = summarise({"traceEvents": events}, steps=2)
    assert out["compute_stream"] == "7"
    assert out["streams"]["7"]["busy_ms"] == (100 + 40 + 80) / 1e3 / 2
    assert out["streams"]["7"]["kernels"] == 1.5
    assert out["streams"]["16"]["busy_ms"] == 60 / 1e3 / 2
    assert out["streams"]["7"]["top"][0] == ["first", 100 / 1e3 / 2]
    assert out["host_gap_ms"] == 30 / 1e3 / 2
    assert out["other_gap_ms"] == (20 + 20) / 1e3 / 2
    assert out["span_ms"] == (300 - 10) / 1e3 / 2


def test_an_empty_timeline_has_no_streams():
    assert summarise({"traceEvents": []}, steps=1) == {"streams": {}}


@pytest.mark.slow
def test_the_tool_runs_every_kind_of_variant_over_two_ranks(tmp_path):
    """Two CPU ranks (gloo), the tensor-core arrays under Triton's interpreter: one GPU's step, a sharded step routed
    ahead and a replicated one with its split optimizer, each rank's summary, trace and host profile written."""
    done = run_tool("benchmarks.tools.sharded_step_trace", "--out", str(tmp_path), "--batch", "512", "--networks",
                    "4", "--reps", "1", "--steps", "1", "--host-profile", "1", "--variants",
                    "one,sharded_ahead,replicated_split")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.load(open(tmp_path / "summary.json"))
    assert list(rows) == ["one", "sharded_ahead", "replicated_split"]
    assert rows["one"][1] is None  # the one-GPU step runs on rank 0 alone
    for variant, per_rank in rows.items():
        for rank, row in enumerate(per_rank):
            if row is None:
                continue
            assert row["wall_ms"] > 0 and row["issue_ms"] > 0, (variant, rank)
            assert (tmp_path / f"{variant}_rank{rank}.json.gz").exists()
            assert "function calls" in (tmp_path / f"{variant}_rank{rank}.pstats.txt").read_text()
    assert "replicated_split" in done.stdout  # rank 0's table


def test_an_unknown_variant_is_refused_by_name():
    done = subprocess.run([sys.executable, "-m", "benchmarks.tools.sharded_step_trace", "--out", "unused",
                           "--variants", "one,shard"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--variants ['shard'] are not known; allowed: ['one', 'sharded'," in done.stderr

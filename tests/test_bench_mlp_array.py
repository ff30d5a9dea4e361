"""benchmarks/bench_mlp_array.py at toy size: both timings of every training step, ratios made from them, the
fastest torch baseline of a row, and the tensor-core bmm baselines (TF32, autocast float16)."""
import dataclasses

import pytest
import torch

import tinn
from benchmarks import bench_mlp_array

ON_CPU = tinn.runtime.arch() == "cpu"


@pytest.fixture(scope="module")
def row():
    return bench_mlp_array.bench_case(4, 10, 16, 8, 3, 1, "ragged", reps=2, skip_torch=False, vmap=False)


@pytest.fixture
def tf32_flag():
    """The process-wide TF32 flag, put back after the test whatever the test left."""
    before = torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def test_a_case_reports_synced_and_pipelined_steps(row):
    for prefix in ("tinn", "torch"):
        assert row[f"{prefix}_train_ms"] > 0 and row[f"{prefix}_train_pipelined_ms"] > 0
        low, high = row[f"{prefix}_train_pipelined_spread_ms"]
        assert low <= row[f"{prefix}_train_pipelined_ms"] <= high  # the median of the blocks lies within them
        assert row[f"{prefix}_train_pipelined_spread_pct"] == pytest.approx(
            100 * (high - low) / row[f"{prefix}_train_pipelined_ms"])
    assert row["train_speedup"] == pytest.approx(row["torch_train_ms"] / row["tinn_train_ms"])
    assert row["train_speedup_pipelined"] == pytest.approx(row["torch_train_pipelined_ms"]
                                                           / row["tinn_train_pipelined_ms"])
    assert row["fwd_speedup"] == pytest.approx(row["torch_fwd_ms"] / row["tinn_fwd_ms"])


@pytest.mark.skipif(not ON_CPU, reason="the tensor-core baselines run on CUDA")
def test_the_cuda_only_baselines_are_skipped_with_a_reason_on_the_cpu(row):
    for prefix in ("bmm_tf32", "bmm_fp16"):
        assert row[f"{prefix}_note"].startswith("skipped:") and "CUDA only" in row[f"{prefix}_note"]
        assert not any(k.startswith(prefix + "_") and k.endswith("_ms") for k in row)
    shown = bench_mlp_array.table_row(row)
    assert shown["not_run"] == "bmm tf32, bmm autocast fp16"
    assert shown["notes"].startswith("bmm tf32: skipped: CUDA only")
    # The fp32 bmm is then the only torch baseline that ran (no vmap asked, grouped GEMMs are CUDA only).
    assert row["fastest_torch_train"] == "bmm fp32"
    assert row["fastest_torch_train_ms"] == row["torch_train_ms"]
    assert row["fastest_torch_train_speedup"] == pytest.approx(row["train_speedup"])
    assert row["train_goal_met"] == (row["train_speedup"] >= 1.5)
    assert row["fastest_torch_fwd"] == "bmm fp32"
    assert row["fwd_goal_met"] == (row["fwd_speedup"] >= 2.5)
    assert row["fastest_torch_train_pipelined_speedup"] == pytest.approx(row["train_speedup_pipelined"])


def test_the_fastest_torch_baseline_is_the_minimum_of_those_that_ran():
    row = {"tinn_train_ms": 6.0, "tinn_train_pipelined_ms": 5.0, "tinn_fwd_ms": 1.0,
           "torch_train_ms": 20.0, "bmm_tf32_train_ms": 12.0, "bmm_fp16_train_ms": 9.0, "vmap_train_ms": 25.0,
           "gmm_bf16_train_ms": 10.0, "gmm_fp32_train_ms": None,
           "torch_train_pipelined_ms": 19.0, "bmm_fp16_train_pipelined_ms": 11.0, "gmm_bf16_train_pipelined_ms": 7.0,
           "torch_fwd_ms": 4.0, "bmm_tf32_fwd_ms": 2.0, "bmm_fp16_fwd_ms": 2.2, "gmm_fp32_fwd_ms": 3.0}
    cols = bench_mlp_array.fastest_torch_columns(row)
    assert bench_mlp_array.fastest_torch(row, "train_ms") == ("bmm autocast fp16", 9.0)
    assert (cols["fastest_torch_train"], cols["fastest_torch_train_ms"]) == ("bmm autocast fp16", 9.0)
    assert cols["fastest_torch_train_speedup"] == pytest.approx(1.5)
    assert cols["train_goal_met"] is True  # exactly 1.5x meets the goal
    assert (cols["fastest_torch_train_pipelined"], cols["fastest_torch_train_pipelined_ms"]) == ("gmm bf16", 7.0)
    assert cols["fastest_torch_train_pipelined_speedup"] == pytest.approx(1.4)
    assert cols["train_pipelined_goal_met"] is False
    assert (cols["fastest_torch_fwd"], cols["fastest_torch_fwd_ms"]) == ("bmm tf32", 2.0)
    assert cols["fastest_torch_fwd_speedup"] == pytest.approx(2.0)
    assert cols["fwd_goal_met"] is False
    shown = bench_mlp_array.table_row({**row, **cols})
    assert (shown["train_goal"], shown["train_pipelined_goal"], shown["fwd_goal"]) == ("met", "not met", "not met")


def test_no_torch_baseline_leaves_the_fastest_columns_empty():
    cols = bench_mlp_array.fastest_torch_columns({"tinn_train_ms": 1.0, "tinn_fwd_ms": 1.0, "gmm_fp32_fwd_ms": None})
    assert set(cols.values()) == {None}
    assert bench_mlp_array.table_row(cols)["train_goal"] is None


class FailingBaseline(torch.nn.Module):
    """Stands in for the bmm model: records the TF32 flag it runs under, then fails."""
    seen: list = []

    def __init__(self, net):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, ids, n):
        FailingBaseline.seen.append(torch.backends.cuda.matmul.allow_tf32)
        raise RuntimeError("baseline failed")


@pytest.mark.parametrize("precision, before, inside", [
    (bench_mlp_array.BMM_FP32, True, False),  # the fp32 row is fp32 whatever the process set
    (dataclasses.replace(bench_mlp_array.BMM_TF32, cuda_only=False), False, True),
])
def test_the_tf32_flag_is_restored_when_the_baseline_raises(monkeypatch, tf32_flag, precision, before, inside):
    monkeypatch.setattr(bench_mlp_array, "TorchBmmArray", FailingBaseline)
    FailingBaseline.seen = []
    torch.backends.cuda.matmul.allow_tf32 = before
    x, ids = torch.zeros(4, 2), torch.zeros(4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="baseline failed"):
        bench_mlp_array.time_bmm({}, precision, None, x, ids, torch.zeros(4, 1), 1, reps=1)
    assert FailingBaseline.seen == [inside]
    assert torch.backends.cuda.matmul.allow_tf32 is before


def test_tf32_matmuls_restores_the_flag_on_error(tf32_flag):
    torch.backends.cuda.matmul.allow_tf32 = False
    with pytest.raises(ZeroDivisionError):
        with bench_mlp_array.tf32_matmuls(True):
            assert torch.backends.cuda.matmul.allow_tf32 is True
            1 / 0
    assert torch.backends.cuda.matmul.allow_tf32 is False


def small_array(n=4):
    from tinn.networks import NetworkArray
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
           "output_activation": "None"}
    return NetworkArray(8, 3, cfg, n_networks=n)


def test_the_bmm_baseline_under_autocast_float16_matches_float64_and_trains_float32_parameters(device):
    net, n = small_array(), 4
    x, target = torch.rand(256, 8, device=device), torch.rand(256, 3, device=device)
    ids = bench_mlp_array.make_ids(256, n, "ragged", device)
    weights = [net.weights(l).detach().double() for l in range(net.n_layers)]
    expected = x.double()
    for l, w in enumerate(weights):  # per sample, its own network's layers
        expected = torch.einsum("boi,bi->bo", w[ids.long()], expected)
        expected = torch.relu(expected) if l < len(weights) - 1 else expected
    model = bench_mlp_array.TorchBmmArray(net).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16):
        y = model(x, ids.long(), n)
    assert y.dtype == torch.float16  # computed in float16, and gathered without a cast
    torch.testing.assert_close(y.double(), expected, rtol=1e-2, atol=1e-2)

    before = [p.detach().clone() for p in model.parameters()]
    row = {}
    bench_mlp_array.time_torch(row, "bmm_fp16", model, x, ids, target, n, reps=1, autocast_dtype=torch.float16)
    assert row["bmm_fp16_fwd_ms"] > 0 and row["bmm_fp16_train_ms"] > 0 and row["bmm_fp16_train_pipelined_ms"] > 0
    for p, p0 in zip(model.parameters(), before):
        assert p.dtype == torch.float32  # the parameters stay float32; autocast casts per use
        assert not torch.equal(p.detach(), p0)  # the scaled steps updated them

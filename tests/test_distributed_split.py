"""Replicated parts with the optimizer split over the ranks (ZeRO stage 1, tinn/distributed/optimizer_split.py):
the layout in one process; over 2 CPU processes with gloo, Trainer steps against the all-reduce path and a
single-process reference, checkpoints of the split state, the overflow agreement and bad options."""
from __future__ import annotations

import pytest
import torch

import tinn

import distributed_worker as W  # noqa: E402  (tests/ is on sys.path under pytest)
from test_distributed import WORLD, cpu_reference, run_ranks  # noqa: E402


def test_layout_tiles_the_padded_vector_in_rows_and_row_parts():
    """Three ranks over tables of 5 x 7 and 3 x 4 values (47, padded to 48): every element in exactly one
    piece, each piece inside its rank's slice, a view of its table's memory, whole rows or part of one."""
    from tinn.distributed.optimizer_split import FlatSplit

    dev = tinn.runtime.device()
    tables = [("a", torch.arange(35, dtype=torch.float32, device=dev).view(5, 7)),
              ("b", torch.arange(35, 47, dtype=torch.float32, device=dev).view(3, 4))]
    covered = []
    for rank in range(3):
        split = FlatSplit(tables, rank, 3, dev, None)
        assert (split.numel, split.slice_len, split.padded) == (47, 16, 48)
        assert (split.lo, split.hi) == (16 * rank, 16 * rank + 16)
        for p in split.pieces:
            assert split.lo <= p.flat_lo < p.flat_hi <= split.hi
            t = tables[p.table][1]
            cols = t.shape[1]
            assert p.view.data_ptr() == t.data_ptr() + 4 * (p.flat_lo - split.offsets[p.table])
            assert p.view.numel() == p.flat_hi - p.flat_lo and p.view.is_contiguous()
            assert p.view.shape[0] == 1 or p.view.shape[1] == cols  # part of one row, or whole rows
            assert p.row_hi - p.row_lo == p.view.shape[0]
            # The values (the flat index) say where the view reads.
            assert torch.equal(p.view.reshape(-1).cpu(), torch.arange(p.flat_lo, p.flat_hi, dtype=torch.float32))
            covered += range(p.flat_lo, p.flat_hi)
    assert sorted(covered) == list(range(47))
    # Rank 0 ends inside row 2 of "a" (16 = 2 x 7 + 2): whole rows 0-1, then 2 values of row 2.
    shapes = [tuple(p.view.shape) for p in FlatSplit(tables, 0, 3, dev, None).pieces]
    assert shapes == [(2, 7), (1, 2)]


def test_bad_split_options_name_the_option():
    from tinn.distributed.optimizer_split import check_split, refuse_split

    with pytest.raises(tinn.errors.ConfigError, match=r"optimizer_split='yes'.*allowed: \['auto', True, False\]"):
        check_split("yes")
    assert check_split(True) is True and check_split("auto") == "auto"
    text = str(refuse_split({"otype": "Shampoo"}))
    assert "optimizer_split=True" in text and "Shampoo" in text and "['Adam', 'SGD']" in text


@pytest.fixture(scope="module")
def split_run(tmp_path_factory):
    return run_ranks("split", tmp_path_factory.mktemp("split"))


def _single_process(kind, optimizer, steps=W.SPLIT_STEPS):
    """The part trained in this process on the union of the ranks' batches (the mean loss of equal batches is
    the mean over ranks of their mean losses)."""
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    model = W.split_model(kind)
    trainer = Trainer(model, optimizer=optimizer)
    name, table = list(model.named_parameters())[-1]
    trainer.optimizer.set_lr_scale(name, W.split_lr_scale(table.shape[0]).to(dev))
    for step in range(steps):
        bs = [tuple(v.to(dev) for v in W.batch(r, 70 + step)) for r in range(WORLD)]
        trainer.training_step(torch.cat([b[0] for b in bs]), torch.cat([b[2] for b in bs]),
                              torch.cat([b[1] for b in bs]))
    return {f"inner.{n}": p.detach().cpu() for n, p in model.named_parameters()}


@cpu_reference
def test_split_steps_equal_the_all_reduce_and_one_process(split_run):
    """Adam and SGD, float32 and bfloat16 reduces, per-network learning-rate scales: the split run's parameters
    equal the all-reduce run's to float32 rounding (bfloat16: the same rounded sums), are bit-identical across
    ranks, and equal one process's steps on the union of the batches. Each rank keeps Adam's moments for its half
    of the parameters only, and the tables hold no gradient after a backward (the reduced slice does)."""
    _check_split_steps(split_run)


def _check_split_steps(split_run, atol: float = 1e-6):
    """`test_split_steps_equal_the_all_reduce_and_one_process` on a run's results (atol: the parameters' absolute
    tolerance; GPU atomics add in an order of their own, which Adam's normalised steps carry into the weights)."""
    for case, (kind, optimizer, reduce_dtype) in W.SPLIT_CASES.items():
        split = [res[f"{case}/split"] for res in split_run]
        plain = [res[f"{case}/allreduce"] for res in split_run]
        assert all(s["split"] for s in split) and not any(p["split"] for p in plain), case
        for n, value in split[0]["params"].items():
            assert torch.equal(value, split[1]["params"][n]), (case, n)  # ranks bit-identical
            torch.testing.assert_close(value, plain[0]["params"][n], rtol=1e-5, atol=atol, msg=f"{case} {n}")
        for s, p in zip(split, plain):
            torch.testing.assert_close(torch.tensor(s["losses"]), torch.tensor(p["losses"]), rtol=1e-5, atol=1e-7)
        if reduce_dtype == "float32":
            want = _single_process(kind, optimizer)
            for n, value in split[0]["params"].items():
                assert not torch.equal(value, W.split_model(kind).state_dict()[n[len("inner."):]].cpu()), n  # it trained
                torch.testing.assert_close(value, want[n], rtol=1e-4, atol=atol, msg=f"{case} {n}")
        numel, slice_len = split[0]["layout"]
        assert slice_len * WORLD == numel  # no padding needed here (the layout test pads)
        for r, s in enumerate(split):
            assert sum(hi - lo for _, _, lo, hi in s["pieces"]) == slice_len
            assert s["pieces"][0][2] == r * slice_len
            if optimizer["otype"] == "Adam":
                assert s["state_elements"] == slice_len
            assert s["grads_after_backward"] == [None] * len(s["params"])
            assert s["grad_slice"].shape == (slice_len,) and bool(s["grad_slice"].abs().sum() > 0)
    for res in split_run:  # per step: the reduce-scatter and the all-gather ("reduce"), the slice's update
        marks, profile = res["profile_marks"], res["profile"]
        assert marks.count("reduce") == 4 and marks.count("optimizer") == 2, marks
        assert marks.index("optimizer") < marks.index("reduce", marks.index("reduce") + 1)
        assert profile["optimizer"] > 0 and profile["reduce"] > 0 and profile["compute"] > 0
    # The grid's table (6 x 160) ends rank 0's slice of 816 values inside its row 5.
    shapes = [p[1] for p in split_run[0]["two_tables/adam/float32/split"]["pieces"]]
    assert shapes == [(5, 160), (1, 16)]


@cpu_reference
def test_split_steps_through_the_triton_step_kernels(tmp_path):
    """The split scenario with Adam and the gradient scaler's checks as Triton launches (`tuning.triton_step_kernels`,
    the CUDA default; Triton's interpreter here): the same steps, checkpoints and overflow agreement as through
    Taichi's kernels, against the same one-process reference (which steps through Taichi's)."""
    from tinn.kernels import triton_available
    if not triton_available():
        pytest.skip("Triton is not installed")
    runs = run_ranks("split", tmp_path, settings="triton_step_kernels=true")
    _check_split_steps(runs)
    _check_split_checkpoint(runs)
    assert [r["found_inf"] for r in runs] == [1.0, 1.0]


two_gpus = pytest.mark.skipif(tinn.runtime.arch() != "cuda" or torch.cuda.device_count() < 2
                              or not torch.distributed.is_nccl_available(),
                              reason="needs tinn on CUDA, two GPUs and NCCL")


@two_gpus
def test_split_over_nccl_steps_like_the_all_reduce(tmp_path):
    """The split scenario over NCCL, one GPU per rank: the reduce-scatter, the in-place all-gather of a one-table
    part and the gathered one of a two-table part, against the all-reduce and this process's GPU; checkpoints
    and the overflow agreement as on the CPU."""
    runs = run_ranks("split", tmp_path, TINN_ARCH="cuda", TRITON_INTERPRET=0, NCCL_NVLS_ENABLE=0)
    _check_split_steps(runs, atol=1e-5)
    # The grid's backward adds with float atomics on CUDA, in an order that changes run to run (outside
    # deterministic mode), so the resumed step matches to rounding there; the restored state itself is bit for bit.
    _check_split_checkpoint(runs, resumed_step_atol=1e-6)
    assert [r["found_inf"] for r in runs] == [1.0, 1.0]


@cpu_reference
def test_split_checkpoint_holds_the_whole_state_bit_for_bit(split_run):
    """The split optimizer's state_dict is the unsplit optimizer's (the same keys, shapes and dtypes, the
    same values to float32 rounding) gathered from both ranks; reloaded into a split or an unsplit trainer it
    comes back bit for bit, and the resumed run steps on bit-identically. A state with one wrong shape is
    refused and changes nothing."""
    _check_split_checkpoint(split_run)


def _check_split_checkpoint(split_run, resumed_step_atol: float = 0.0):
    for res in split_run:
        saved, ref = res["saved_state"], res["allreduce_state"]
        assert set(saved) == set(ref) and saved["otype"] == "Adam" and saved["step_count"] == 2
        for key, value in ref.items():
            if isinstance(value, torch.Tensor):
                assert saved[key].shape == value.shape and saved[key].dtype == value.dtype, key
                torch.testing.assert_close(saved[key], value, rtol=1e-4, atol=1e-7, msg=key)
            else:
                assert saved[key] == value, key
        assert bool(saved["v.inner.network.params"].abs().min() > 0)  # every element's moment came from its rank
        for restored in (res["restored_state"], res["unsplit_restored_state"]):
            assert set(restored) == set(saved)
            for key, value in saved.items():
                same = torch.equal(restored[key], value) if isinstance(value, torch.Tensor) else restored[key] == value
                assert same, key
        if resumed_step_atol == 0.0:
            assert res["same_after_step"]
        else:
            assert res["after_step_max_diff"] <= resumed_step_atol, res["after_step_max_diff"]
        assert "v.inner.network.params" in res["bad_state"] and res["bad_state_untouched"], res["bad_state"]
    for key, value in split_run[0]["saved_state"].items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, split_run[1]["saved_state"][key]), key


@cpu_reference
def test_split_overflow_agreement_and_options(split_run):
    """Rank 0's overflow reaches rank 1 through the split backward; optimizer_split=True refuses an optimizer
    that is not elementwise, "auto" keeps the all-reduce for it and for a 16-bit reduce (Adam splits with a float32
    one); a bad value names the allowed ones."""
    assert [r["found_inf"] for r in split_run] == [1.0, 1.0]
    for res in split_run:
        assert "optimizer_split='yes' is not supported; allowed: ['auto', True, False]" in res["bad_value"]
        assert "optimizer_split=True needs an elementwise optimizer; Novograd is not" in res["not_elementwise"]
        assert res["novograd_auto_split"] is False
        assert res["auto_split_by_reduce_dtype"] == {"float32": True, "bfloat16": False}
    for n, value in split_run[0]["novograd_params"].items():
        assert torch.equal(value, split_run[1]["novograd_params"][n]), n


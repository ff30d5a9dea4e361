"""The exchange's per-sample passes (tinn/distributed/buckets.py) in one process: the Triton kernels (on CUDA,
or in Triton's interpreter on the CPU) against the torch ops, and both against their definition."""
from __future__ import annotations

import pytest
import torch

import tinn
from tinn.distributed import buckets as B

DEV = tinn.runtime.device()
triton_here = pytest.mark.skipif(not B.use_triton("triton", DEV), reason="Triton runs neither on CUDA nor in its "
                                 "interpreter here")


def _case(n, world, chunks, d, n_networks=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g)
    owner = torch.randint(0, world, (n_networks,), generator=g, dtype=torch.int32)
    local = torch.randint(0, 1000, (n_networks,), generator=g, dtype=torch.int32)
    ids = torch.randint(0, n_networks, (n,), generator=g, dtype=torch.int32)
    return [t.to(DEV) for t in (x, ids, owner, local)]


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
@pytest.mark.parametrize("n,world,chunks,d", [(37, 2, 1, 3), (100, 3, 2, 5), (50, 2, 3, 32), (5, 4, 1, 1),
                                              (2, 2, 3, 3), (0, 2, 2, 3)])
def test_bucket_is_a_stable_sort_by_chunk_and_owner(kernels, n, world, chunks, d):
    x, ids, owner, local = _case(n, world, chunks, d)
    p = B.bucket(x, ids, owner, local, world, chunks, kernels)
    assert p.counts.shape == (chunks, world) and int(p.counts.sum()) == n
    chunk = torch.arange(n, device=DEV) * chunks // max(n, 1)
    key = (owner[ids.long()].long() + world * chunk).cpu()
    want_perm = torch.sort(key, stable=True).indices
    assert torch.equal(p.perm.long().cpu(), want_perm)
    assert torch.equal(p.dest.long().cpu()[want_perm], torch.arange(n))
    assert torch.equal(p.counts.reshape(-1).cpu(), torch.bincount(key, minlength=world * chunks))
    assert torch.equal(p.send[:, :d].cpu(), x.cpu()[want_perm])
    assert torch.equal(p.send[:, d].contiguous().view(torch.int32).cpu(), local.cpu()[ids.long().cpu()][want_perm])
    xs, got_ids = B.unpack(p.send, kernels)
    assert torch.equal(xs, p.send[:, :d]) and got_ids.dtype == torch.int32
    assert torch.equal(got_ids.cpu(), local.cpu()[ids.long().cpu()][want_perm])
    back = B.gather_rows(xs, p.dest, 0.5, kernels)
    assert torch.equal(back, x * 0.5)


@triton_here
@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,e", [(3, 4), (32, 16), (1, 2)])
def test_extra_columns_pack_as_if_joined_to_the_inputs(kernels, dtype, d, e):
    """A loss's targets packed after the inputs (`extra`) give the rows of the joined (d + e)-column inputs, and
    unpack as d + e columns."""
    x, ids, owner, local = _case(61, 2, 2, d + e, seed=d)
    joined = B.bucket(x, ids, owner, local, 2, 2, kernels, dtype)
    apart = B.bucket(x[:, :d].contiguous(), ids, owner, local, 2, 2, kernels, dtype, extra=x[:, d:].contiguous())
    for name in ("send", "perm", "dest", "counts"):
        assert torch.equal(getattr(apart, name), getattr(joined, name)), name
    xs, got_ids = B.unpack(apart.send, kernels, d + e)
    assert torch.equal(xs.cpu(), x.to(dtype).float().cpu()[apart.perm.long().cpu()])


def test_triton_and_torch_bucketing_agree_bit_for_bit():
    x, ids, owner, local = _case(333, 3, 4, 6, n_networks=40, seed=3)
    a = B.bucket(x, ids, owner, local, 3, 4, "torch")
    b = B.bucket(x, ids, owner, local, 3, 4, "triton")
    for name in ("send", "perm", "dest", "counts"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_bad_exchange_kernels_name_the_choices():
    with pytest.raises(tinn.errors.ConfigError, match=r"exchange_kernels='cub'.*'auto', 'triton', 'torch'"):
        B.check_kernels("cub")


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("d", [3, 32, 1])
def test_sixteen_bit_rows_round_the_inputs_once_and_keep_the_ids(kernels, dtype, d):
    """A 16-bit exchange: the inputs packed rounded to the dtype (odd widths padded with a zero so the id stays
    aligned), the 32-bit local ids intact, unpacked to float32; the gather rounds scale x row once."""
    x, ids, owner, local = _case(45, 2, 2, d, n_networks=9, seed=5)
    x = x * 3.7 - 1.1  # values that the dtype rounds
    local = local * 40_000 + 77  # ids past 16 bits
    p = B.bucket(x, ids, owner, local, 2, 2, kernels, dtype=dtype)
    layout = B.RowLayout.of(d, dtype)
    assert p.send.dtype == dtype and p.send.shape == (45, d + d % 2 + 2) and layout.width % 2 == 0
    assert torch.equal(p.send[:, :d], x[p.perm.long()].to(dtype))
    assert not bool(p.send[:, d:layout.stored].any())  # the padding column is zero
    want_ids = local[ids.long()][p.perm.long()]
    assert torch.equal(p.send.view(torch.int32)[:, layout.id_col], want_ids)
    xs, got_ids = B.unpack(p.send, kernels, d)
    assert xs.dtype == torch.float32 and torch.equal(xs, x[p.perm.long()].to(dtype).float())
    assert torch.equal(got_ids, want_ids)
    back = B.gather_rows(xs, p.dest, 0.3, kernels, dtype=dtype)
    assert back.dtype == dtype and torch.equal(back, (x.to(dtype).float() * 0.3).to(dtype))
    wide = B.gather_rows(p.send[:, :d].contiguous(), p.dest, 2.0, kernels)
    assert wide.dtype == torch.float32 and torch.equal(wide, x.to(dtype).float() * 2.0)
    # The float32 layout is the narrow one's special case: the id bit-cast into the last column.
    assert B.RowLayout.of(d) == B.RowLayout(d, torch.float32, d + 1, d + 1, d)


@triton_here
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_and_torch_sixteen_bit_packing_agree_bit_for_bit(dtype):
    x, ids, owner, local = _case(333, 3, 4, 7, n_networks=40, seed=3)
    a = B.bucket(x, ids, owner, local, 3, 4, "torch", dtype=dtype)
    b = B.bucket(x, ids, owner, local, 3, 4, "triton", dtype=dtype)
    for name in ("send", "perm", "dest", "counts"):
        assert torch.equal(getattr(a, name).view(torch.int16) if name == "send" else getattr(a, name),
                           getattr(b, name).view(torch.int16) if name == "send" else getattr(b, name)), name


def test_bad_exchange_dtype_names_the_choices():
    with pytest.raises(tinn.errors.ConfigError,
                       match=r"exchange_dtype='int8' is not supported; allowed: \['float32', 'float16', 'bfloat16'\]"):
        B.exchange_dtype("int8")
    assert B.exchange_dtype("bfloat16") == torch.bfloat16

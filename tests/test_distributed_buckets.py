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
def test_triton_and_torch_bucketing_agree_bit_for_bit():
    x, ids, owner, local = _case(333, 3, 4, 6, n_networks=40, seed=3)
    a = B.bucket(x, ids, owner, local, 3, 4, "torch")
    b = B.bucket(x, ids, owner, local, 3, 4, "triton")
    for name in ("send", "perm", "dest", "counts"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_bad_exchange_kernels_name_the_choices():
    with pytest.raises(tinn.errors.ConfigError, match=r"exchange_kernels='cub'.*'auto', 'triton', 'torch'"):
        B.check_kernels("cub")

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


def _owned_case(n, world, chunks, d, n_networks=11, seed=0):
    """A batch and ownership tables as tinn.distributed.Ownership builds them: local id = rank among the owner's
    networks. Returns (x, ids, owner, local, L = the most networks a rank owns)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g)
    owner = torch.randint(0, world, (n_networks,), generator=g, dtype=torch.int32)
    local = torch.empty_like(owner)
    for r in range(world):
        local[owner == r] = torch.arange(int((owner == r).sum()), dtype=torch.int32)
    ids = torch.randint(0, n_networks, (n,), generator=g, dtype=torch.int32)
    most = max(int((owner == r).sum()) for r in range(world))
    return [t.to(DEV) for t in (x, ids, owner, local)] + [most]


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,world,chunks,d,e", [(61, 2, 1, 3, 4), (100, 3, 2, 5, 0), (9, 4, 1, 1, 2), (0, 2, 2, 3, 1),
                                                (300, 2, 3, 32, 16)])
def test_bucket_by_network_sorts_each_bucket_by_local_network(kernels, dtype, n, world, chunks, d, e):
    """`by_network=L`: a stable sort by (chunk, owner, local id), the samples per (chunk, owner, local network),
    and the same rows as the plain packing of that order."""
    x, ids, owner, local, most = _owned_case(n, world, chunks, d + e, seed=n)
    xs, extra = x[:, :d].contiguous(), (x[:, d:].contiguous() if e else None)
    p = B.bucket(xs, ids, owner, local, world, chunks, kernels, dtype, extra=extra, by_network=most)
    chunk = torch.arange(n, device=DEV) * chunks // max(n, 1)
    key = ((owner[ids.long()].long() + world * chunk) * most + local[ids.long()].long()).cpu()
    want_perm = torch.sort(key, stable=True).indices
    assert torch.equal(p.perm.long().cpu(), want_perm)
    assert torch.equal(p.dest.long().cpu()[want_perm], torch.arange(n))
    assert torch.equal(p.network_counts.reshape(-1).cpu(), torch.bincount(key, minlength=world * chunks * most))
    assert torch.equal(p.counts.cpu(), p.network_counts.sum(2).cpu()) and p.counts.shape == (chunks, world)
    plain = B.bucket(xs, ids, owner, local, world, chunks, "torch", dtype, extra=extra)
    # Each sample's packed row (its inputs, extra columns, padding and local id) as the plain packing writes it.
    assert torch.equal(p.send[p.dest.long()], plain.send[plain.dest.long()])
    assert torch.equal(p.send.float().cpu()[:, :d + e], x.to(dtype).float().cpu()[want_perm])


def test_triton_and_torch_bucketing_by_network_agree_bit_for_bit():
    x, ids, owner, local, most = _owned_case(333, 3, 2, 6, n_networks=40, seed=3)
    if not B.use_triton("triton", DEV):
        pytest.skip("Triton runs neither on CUDA nor in its interpreter here")
    a = B.bucket(x, ids, owner, local, 3, 2, "torch", by_network=most)
    b = B.bucket(x, ids, owner, local, 3, 2, "triton", by_network=most)
    for name in ("send", "perm", "dest", "counts", "network_counts"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
@pytest.mark.parametrize("sizes,runs", [((40, 13), [(0, 2)]), ((40, 13), [(0, 1), (1, 2)]), ((0, 25, 7), [(0, 3)]),
                                         ((9, 0, 30, 4), [(0, 2), (2, 3), (3, 4)]), ((17,), [(0, 1)])])
def test_unpack_merges_the_senders_rows_grouped_by_network(kernels, sizes, runs):
    """An owner receiving each rank's rows sorted by local network unpacks them as a stable sort by network of
    each run of ranks' rows gives them (runs in order), with each run's network bounds."""
    n_local, d, e = 5, 3, 2
    pieces, counts = [], []
    for s, size in enumerate(sizes):
        x, ids, _, _, _ = _owned_case(size, 1, 1, d + e, n_networks=n_local, seed=10 + s)
        identity = torch.arange(n_local, dtype=torch.int32, device=DEV)
        p = B.bucket(x[:, :d].contiguous(), ids, torch.zeros_like(identity), identity, 1, 1, kernels,
                     extra=x[:, d:].contiguous(), by_network=n_local)
        pieces.append(p.send)
        counts.append(p.network_counts[0, 0])
    received = torch.cat(pieces)
    merge = B.merge_by_network(torch.stack(counts), runs, n_local, kernels)
    reference = B.merge_by_network(torch.stack(counts), runs, n_local, "torch")
    for name in ("starts", "delta"):  # one run: the Triton program's tables, against the torch ops'
        assert torch.equal(getattr(merge, name), getattr(reference, name)), name
    assert all(torch.equal(a, b) for a, b in zip(merge.bounds, reference.bounds))
    got = B.unpack_split(received, d, e, kernels, merge)
    plain = [t.cpu() for t in B.unpack_split(received, d, e, "torch")]
    start = 0
    for r, (lo, hi) in enumerate(runs):
        stop = start + sum(sizes[lo:hi])
        order = torch.sort(plain[2][start:stop], stable=True).indices + start
        for want, have in zip(plain, got):
            assert torch.equal(have.cpu()[start:stop], want[order])
        want_bounds = torch.searchsorted(plain[2][order].long(), torch.arange(n_local + 1))
        assert torch.equal(merge.bounds[r].cpu(), want_bounds), r
        start = stop


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=triton_here)])
def test_merge_tables_past_the_one_program_limit_go_through_torch(kernels, monkeypatch):
    """More (rank, network) counts than one program scans: the torch ops' tables, the same ones."""
    g = torch.Generator().manual_seed(5)
    counts = torch.randint(0, 4, (3, 40), generator=g).to(DEV)
    want = B.merge_by_network(counts, [(0, 3)], 33, "torch")
    monkeypatch.setattr(B, "MAX_MERGE_PROGRAM_BINS", 3 * 40 - 1)
    got = B.merge_by_network(counts, [(0, 3)], 33, kernels)
    assert torch.equal(got.starts, want.starts) and torch.equal(got.delta, want.delta)
    assert torch.equal(got.bounds[0], want.bounds[0]) and got.bounds[0].shape == (34,)

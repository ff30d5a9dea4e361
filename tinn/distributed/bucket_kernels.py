"""Triton kernels of the exchange's per-sample passes (imported only where they run: CUDA, or Triton's CPU
interpreter in tests). tinn/distributed/buckets.py holds the torch version of the same functions, which
is the reference and the path on the CPU.

A *key* is `owner(id) + world * chunk(i)` with chunk(i) = (i * chunks) // batch: a stable counting sort by
key puts the samples in (chunk, owner) order, so each chunk's samples for each rank are one contiguous run.

    count_kernel:  per block of samples, how many fall in each key             -> block_counts (blocks, K)
    pack_kernel:   each sample's position (block offset + rank inside its block among equal keys),
                   its input row (and extra columns after it) and local id written there; dest[i] = position,
                   perm[position] = i
    pack_at_kernel: the same rows written at the positions of a sort already made (`dest`): the packing by
                   (chunk, owner, local network) of tinn/distributed/buckets.py's `pack_by_network`
    merge_kernel:  one program computing the tables with which an owner unpacks every rank's rows grouped by
                   network (`merge_by_network`)
    unpack_kernel: a received packed buffer split into float32 inputs (and extra columns) and int32 local ids,
                   each row written where it goes (its own row, or its place in the batch grouped by network
                   across the sending ranks: row i + delta[sender, local id])

The rows' return to the caller's order (dy out, dx back) is tinn/kernels/row_gather.py's gather.

A packed row (tinn/distributed/buckets.py, `RowLayout`) holds the inputs in the exchange dtype, then the local
id's 32 bits; the kernels address the id through an int32 view of the same buffer (`ids` pointer, row stride
ID_ROW, column ID_COL). Values are stored in the element type of the pointer they go to, so the casts to and
from a 16-bit exchange dtype happen in these passes; arithmetic (the gather's scale) is in float32.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..kernels.row_gather import store_rows

# The sample count `n` changes from step to step in scenes; Triton would specialise on its divisibility by 16
# and compile a kernel again mid-training, so no kernel here specialises on it.


@triton.jit
def _keys(ids_ptr, owner_ptr, offs, mask, n, chunks, world, K: tl.constexpr):
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    owner = tl.load(owner_ptr + ids, mask=mask, other=0)
    chunk = ((offs.to(tl.int64) * chunks) // n).to(tl.int32)
    return ids, tl.where(mask, owner + world * chunk, K)  # K: out of every bucket


@triton.jit(do_not_specialize=["n"])
def count_kernel(ids_ptr, owner_ptr, counts_ptr, n, chunks, world, K: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _, key = _keys(ids_ptr, owner_ptr, offs, mask, n, chunks, world, K)
    for k in tl.static_range(K):
        tl.store(counts_ptr + pid * K + k, tl.sum((key == k).to(tl.int32), axis=0))


@triton.jit
def _write_rows(local_ptr, ids, x_ptr, extra_ptr, send_ptr, send_ids_ptr, sample, pos, mask, D, E, ROW, ID_ROW, ID_COL,
                DS, DP: tl.constexpr, BF16: tl.constexpr):
    """Packed rows of the samples `sample` (their inputs, `extra` columns and local ids; global ids `ids`) written
    at rows `pos` of the send buffer."""
    local = tl.load(local_ptr + ids, mask=mask, other=0)
    cols = tl.arange(0, DP)
    # DS >= D + E columns are written: a 16-bit row's padding column (odd D + E) gets a zero. Columns D.. come
    # from `extra` (E per sample; none when E = 0).
    rows = tl.load(x_ptr + sample[:, None] * D + cols[None, :], mask=mask[:, None] & (cols[None, :] < D), other=0.0)
    tail = mask[:, None] & (cols[None, :] >= D) & (cols[None, :] < D + E)
    rows += tl.load(extra_ptr + sample[:, None] * E + (cols[None, :] - D), mask=tail, other=0.0)
    store_rows(send_ptr + pos[:, None] * ROW + cols[None, :], rows, mask[:, None] & (cols[None, :] < DS), BF16)
    tl.store(send_ids_ptr + pos * ID_ROW + ID_COL, local, mask=mask)


@triton.jit(do_not_specialize=["n"])
def pack_kernel(ids_ptr, owner_ptr, local_ptr, x_ptr, extra_ptr, offsets_ptr, send_ptr, send_ids_ptr, dest_ptr,
                perm_ptr, n, chunks, world, D, E, ROW, ID_ROW, ID_COL, DS, K: tl.constexpr, BLOCK: tl.constexpr,
                DP: tl.constexpr, BF16: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ids, key = _keys(ids_ptr, owner_ptr, offs, mask, n, chunks, world, K)
    pos = tl.zeros([BLOCK], dtype=tl.int64)
    for k in tl.static_range(K):
        hit = key == k
        # Rank among this block's samples of key k, in sample order: the sort stays stable.
        before = tl.cumsum(hit.to(tl.int32), axis=0) - 1
        base = tl.load(offsets_ptr + pid * K + k).to(tl.int64)
        pos = tl.where(hit, base + before, pos)
    tl.store(dest_ptr + offs, pos.to(tl.int32), mask=mask)
    tl.store(perm_ptr + pos, offs.to(tl.int32), mask=mask)
    _write_rows(local_ptr, ids, x_ptr, extra_ptr, send_ptr, send_ids_ptr, offs, pos, mask, D, E, ROW, ID_ROW, ID_COL,
                DS, DP, BF16)


@triton.jit(do_not_specialize=["n"])
def pack_at_kernel(dest_ptr, ids_ptr, local_ptr, x_ptr, extra_ptr, send_ptr, send_ids_ptr, n, D, E, ROW, ID_ROW, ID_COL,
                   DS, BLOCK: tl.constexpr, DP: tl.constexpr, BF16: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    pos = tl.load(dest_ptr + offs, mask=mask, other=0).to(tl.int64)
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    _write_rows(local_ptr, ids, x_ptr, extra_ptr, send_ptr, send_ids_ptr, offs, pos, mask, D, E, ROW, ID_ROW, ID_COL,
                DS, DP, BF16)


@triton.jit(do_not_specialize=["n"])
def unpack_kernel(recv_ptr, recv_ids_ptr, x_ptr, extra_ptr, ids_ptr, starts_ptr, delta_ptr, n, D, E, ROW, ID_ROW,
                  ID_COL, L, BLOCK: tl.constexpr, DP: tl.constexpr, WORLD: tl.constexpr):
    """WORLD = 0: row i stays row i. Else the rows of rank s start at starts[s] (s < WORLD), each rank's sorted
    by local id, and row i of rank s with local id m goes to row i + delta[s * L + m]."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    local = tl.load(recv_ids_ptr + offs * ID_ROW + ID_COL, mask=mask, other=0)
    pos = offs
    if WORLD > 0:
        sender = tl.zeros([BLOCK], dtype=tl.int64)
        for s in tl.static_range(1, WORLD):
            sender += (offs >= tl.load(starts_ptr + s)).to(tl.int64)
        pos = offs + tl.load(delta_ptr + sender * L + local, mask=mask, other=0)
    cols = tl.arange(0, DP)
    inside = mask[:, None] & (cols[None, :] < D + E)
    rows = tl.load(recv_ptr + offs[:, None] * ROW + cols[None, :], mask=inside, other=0.0).to(tl.float32)
    tl.store(x_ptr + pos[:, None] * D + cols[None, :], rows, mask=inside & (cols[None, :] < D))
    tl.store(extra_ptr + pos[:, None] * E + (cols[None, :] - D), rows, mask=inside & (cols[None, :] >= D))
    tl.store(ids_ptr + pos, local, mask=mask)


@triton.jit
def merge_kernel(counts_ptr, starts_ptr, delta_ptr, bounds_ptr, L: tl.constexpr, WORLD: tl.constexpr,
                 WP: tl.constexpr, BN: tl.constexpr):
    """One program: the tables of tinn/distributed/buckets.py's `merge_by_network` for one run of every sender,
    from counts (WORLD, L): where each sender's rows start, delta[s, m] and the network bounds (L + 1,). L is a
    constant (one per sharded part; Triton's CPU interpreter takes no argument as a loop bound)."""
    s = tl.arange(0, WP)
    senders = s < WORLD
    totals = tl.zeros([WP], dtype=tl.int64)
    for n0 in range(0, L, BN):
        n = n0 + tl.arange(0, BN)
        h = tl.load(counts_ptr + s[:, None] * L + n[None, :], mask=senders[:, None] & (n[None, :] < L), other=0)
        totals += tl.sum(h, axis=1)
    piece = tl.cumsum(totals, axis=0) - totals  # where each sender's rows start
    tl.store(starts_ptr + s, piece, mask=senders)
    merged = tl.sum(tl.zeros([WP], dtype=tl.int64), axis=0)  # rows of the networks before this block
    sent = tl.zeros([WP], dtype=tl.int64)  # each sender's rows of the networks before this block
    for n0 in range(0, L, BN):
        n = n0 + tl.arange(0, BN)
        inside = senders[:, None] & (n[None, :] < L)
        h = tl.load(counts_ptr + s[:, None] * L + n[None, :], mask=inside, other=0)
        per_network = tl.sum(h, axis=0)
        start = merged + tl.cumsum(per_network, axis=0) - per_network  # network n's first merged row
        before = tl.cumsum(h, axis=0) - h                               # earlier senders' rows of network n
        received_at = piece[:, None] + sent[:, None] + tl.cumsum(h, axis=1) - h
        tl.store(delta_ptr + s[:, None] * L + n[None, :], start[None, :] + before - received_at, mask=inside)
        tl.store(bounds_ptr + n, start, mask=n < L)
        merged += tl.sum(per_network, axis=0)
        sent += tl.sum(h, axis=1)
    tl.store(bounds_ptr + L, merged)


@triton.jit(do_not_specialize=["n"])
def network_keys_kernel(ids_ptr, owner_ptr, local_ptr, key_ptr, hist_ptr, n, chunks, world, L, BLOCK: tl.constexpr):
    """Each sample's key (chunk, owner, local id) = (owner + world * chunk) * L + local id, stored in the element
    type of `key_ptr` (the narrow sort key), and counted into hist (an atomic add per sample)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    ids, key = _keys(ids_ptr, owner_ptr, offs, mask, n, chunks, world, 0)
    key = key * L + tl.load(local_ptr + ids, mask=mask, other=0)
    tl.store(key_ptr + offs, key.to(key_ptr.dtype.element_ty), mask=mask)
    tl.atomic_add(hist_ptr + key, 1, mask=mask, sem="relaxed")

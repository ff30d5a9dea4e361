"""The exchange's per-sample work: samples bucketed by (chunk, owner) and packed, unpacked by the owner,
and rows put back in the caller's order, each in one pass over the samples.

    packing = bucket(x, ids, owner_table, local_table, world, chunks, kernels)
    x_here, ids_here = unpack(received)                  # owner side
    packing = bucket(..., by_network=L)                  # also by local network inside each (chunk, owner)
    merge = merge_by_network(counts_here, runs, n_local) # owner side: where each received row goes so that the
    x_here, extra, ids_here = unpack_split(received, d, e, merge=merge)  # senders' rows come grouped by network
    y = gather_rows(back, packing.dest)                  # caller side: outputs in the caller's order
    dy_out = gather_rows(dy, packing.perm, 1 / world)    # caller side: dy in bucket order, scaled

`bucket` is a stable counting sort computed on the device: no host synchronisation, counts stay on the
device until the exchange's header needs them. With `by_network` it sorts by (chunk, owner, local network)
instead (torch's radix sort), and counts each bucket's samples per local network, in two steps
(`count_by_network`, then `pack_by_network`: the header needs only the counts): an owner receiving every
rank's rows sorted by network can then unpack them straight into the batch grouped by network (each network's
rows in sending-rank order, then in each sender's order: the order a stable sort of the received rows by
network gives), so its local part needs no sort and no gathers of its own.

Rows travel in an exchange dtype (float32, or float16 / bfloat16 for half the bytes): `bucket` casts the
inputs as it packs them, `unpack` widens them to float32, and `gather_rows` reads rows of any of these dtypes
and writes its output in the dtype asked for, so these passes cast as they copy. Two implementations with the
same results: Triton kernels (tinn/distributed/bucket_kernels.py; on CUDA, and under Triton's interpreter in
tests) and torch ops (the CPU, and any device where Triton is missing). `kernels` chooses: "auto" (Triton on
CUDA), "triton", "torch".
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..kernels import triton_available

KERNEL_CHOICES = ("auto", "triton", "torch")
#: `ShardedPart(exchange_dtype=...)`: the dtypes rows can travel in.
EXCHANGE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Keys (world x chunks) the Triton kernels unroll over; more fall back to torch's sort.
MAX_TRITON_KEYS = 32
# (rank, network) counts the one-program merge tables scan; more go through torch's parallel scans.
MAX_MERGE_PROGRAM_BINS = 1 << 16


@dataclass
class Packing:
    """A batch bucketed by (chunk, owner): `send` rows in key order, each row the sample's inputs and its
    local id (`RowLayout`); `perm[p]` is the sample at position p, `dest[i]` the position of sample i (int32);
    `counts` (chunks, world) int64 on the device: samples per chunk and owner; `network_counts` (chunks, world,
    L) int64, packed by network only (`bucket(by_network=L)`): samples per chunk, owner and local network."""
    send: torch.Tensor
    perm: torch.Tensor
    dest: torch.Tensor
    counts: torch.Tensor
    network_counts: torch.Tensor | None = None


@dataclass(frozen=True)
class RowLayout:
    """A packed row of d inputs in `dtype`: `width` elements of that dtype, the inputs first, the local id's
    32 bits last, at int32 column `id_col` of the row viewed as `id_row` int32 values. float32: d + 1
    columns, the id bit-cast into the last. 16-bit: d inputs, a zero when d is odd (the id stays 4-byte
    aligned), then two columns holding the id."""
    d: int
    dtype: torch.dtype
    width: int
    id_row: int
    id_col: int

    @classmethod
    def of(cls, d: int, dtype: torch.dtype = torch.float32) -> "RowLayout":
        if dtype == torch.float32:
            return cls(d, dtype, d + 1, d + 1, d)
        width = d + d % 2 + 2
        return cls(d, dtype, width, width // 2, width // 2 - 1)

    @property
    def stored(self) -> int:
        """Input columns written (the inputs and a 16-bit row's padding)."""
        return self.width - (1 if self.dtype == torch.float32 else 2)


def check_kernels(kernels: str) -> str:
    if kernels not in KERNEL_CHOICES:
        raise ConfigError(f"exchange_kernels={kernels!r} is not supported; allowed: {list(KERNEL_CHOICES)}")
    return kernels


def exchange_dtype(name: str) -> torch.dtype:
    """The torch dtype of an `exchange_dtype` name."""
    if not isinstance(name, str) or name not in EXCHANGE_DTYPES:
        raise ConfigError(f"exchange_dtype={name!r} is not supported; allowed: {list(EXCHANGE_DTYPES)}")
    return EXCHANGE_DTYPES[name]


def _interpreting() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    from . import bucket_kernels
    return isinstance(bucket_kernels.pack_kernel, InterpretedFunction)


def use_triton(kernels: str, device: torch.device, n_keys: int = 1) -> bool:
    """Whether the Triton kernels run this exchange: on CUDA by default; anywhere Triton runs when asked
    for (its interpreter on the CPU)."""
    if kernels == "torch" or n_keys > MAX_TRITON_KEYS or not triton_available():
        return False
    if kernels == "triton":
        return device.type == "cuda" or _interpreting()
    return device.type == "cuda"


def _block(device: torch.device, dims_block: int) -> int:
    from ..kernels.row_gather import block_size
    return block_size(device, dims_block)


def _dims_block(d: int) -> int:
    from ..kernels.row_gather import dims_block
    return dims_block(d)


def bucket(x: torch.Tensor, ids: torch.Tensor, owner_table: torch.Tensor, local_table: torch.Tensor, world: int,
           chunks: int = 1, kernels: str = "auto", dtype: torch.dtype = torch.float32,
           extra: torch.Tensor | None = None, by_network: int = 0) -> Packing:
    """Bucket the samples (x (batch, d) float32, ids (batch,) int32 global ids) by (chunk, owner rank);
    owner_table / local_table: int32 per global id. Stable: inside a bucket samples keep their order. The
    rows are packed in `dtype` (`RowLayout`). extra: (batch, e) float32 columns packed after each row's
    inputs, as if x had d + e columns (a loss's targets travelling with the inputs), without a pass joining
    them first. by_network = L > 0 (every local id below L): inside each bucket, sorted by local id too
    (stable), with `network_counts`."""
    n, d = x.shape
    e = 0 if extra is None else extra.shape[1]
    dev = x.device
    n_keys = world * chunks
    layout = RowLayout.of(d + e, dtype)
    if by_network:
        return pack_by_network(count_by_network(x, ids, owner_table, local_table, world, chunks, by_network, kernels,
                                                dtype, extra))
    if n == 0:
        empty = torch.empty(0, dtype=torch.int32, device=dev)
        return Packing(torch.empty(0, layout.width, dtype=dtype, device=dev), empty, empty,
                       torch.zeros(chunks, world, dtype=torch.int64, device=dev))
    if use_triton(kernels, dev, n_keys):
        return _bucket_triton(x, ids, owner_table, local_table, world, chunks, layout, extra)
    return _bucket_torch(x, ids, owner_table, local_table, world, chunks, layout, extra)


def _keys_torch(ids, owner_table, world, chunks):
    key = owner_table.index_select(0, ids)
    if chunks > 1:
        n = ids.shape[0]
        chunk = torch.div(torch.arange(n, device=ids.device, dtype=torch.int64) * chunks, n, rounding_mode="floor")
        key = key + world * chunk.to(torch.int32)
    return key


def _bucket_torch(x, ids, owner_table, local_table, world, chunks, layout, extra=None):
    n, d = x.shape
    key = _keys_torch(ids, owner_table, world, chunks)
    n_keys = world * chunks
    narrow = torch.uint8 if n_keys < 255 else torch.int32  # a radix sort: one pass per key byte (and n_keys fits)
    sorted_keys, perm = torch.sort(key.to(narrow), stable=True)
    # Counts from the sorted keys (a binary search per bucket boundary): bincount on CUDA reads the largest key
    # back to the host to size its output, a synchronisation.
    bounds = torch.searchsorted(sorted_keys, torch.arange(n_keys + 1, device=x.device, dtype=narrow))
    counts = (bounds[1:] - bounds[:-1]).view(chunks, world)
    dest = torch.empty_like(perm)
    dest.scatter_(0, perm, torch.arange(n, device=x.device, dtype=perm.dtype))
    send = torch.empty(n, layout.width, dtype=layout.dtype, device=x.device)
    _pack_rows_torch(send, layout, x, extra, local_table, ids, perm)
    return Packing(send, perm.to(torch.int32), dest.to(torch.int32), counts)


def _bucket_triton(x, ids, owner_table, local_table, world, chunks, layout, extra=None):
    from . import bucket_kernels

    n, d = x.shape
    e = 0 if extra is None else extra.shape[1]
    dev = x.device
    n_keys = world * chunks
    dims_block = _dims_block(d + e)
    block = _block(dev, dims_block)
    blocks = (n + block - 1) // block
    block_counts = torch.empty(blocks, n_keys, dtype=torch.int32, device=dev)
    ids = ids.contiguous()
    bucket_kernels.count_kernel[(blocks,)](ids, owner_table, block_counts, n, chunks, world, K=n_keys, BLOCK=block)
    # Where each block's run of each key starts: the key's start (all earlier keys' samples) plus the same key's
    # samples in earlier blocks. A (blocks, keys) table: a few small torch ops, no pass over the samples.
    totals = block_counts.sum(0, dtype=torch.int64)
    key_start = torch.cumsum(totals, 0) - totals
    # The scan runs along the blocks with the keys as the outer dimension: torch's scan along a tensor's first
    # dimension parallelises over the other one, here a handful of keys (0.18 ms for 2^21 samples on an H200).
    offsets = (torch.cumsum(block_counts.t(), 1, dtype=torch.int64).t() - block_counts + key_start).contiguous()
    send = torch.empty(n, layout.width, dtype=layout.dtype, device=dev)
    dest = torch.empty(n, dtype=torch.int32, device=dev)
    perm = torch.empty(n, dtype=torch.int32, device=dev)
    x = x.contiguous()
    bucket_kernels.pack_kernel[(blocks,)](ids, owner_table, local_table, x, x if extra is None else extra.contiguous(),
                                          offsets, send, send.view(torch.int32), dest, perm, n, chunks, world, d, e,
                                          layout.width,
                                          layout.id_row, layout.id_col, layout.stored, K=n_keys, BLOCK=block,
                                          DP=dims_block, BF16=layout.dtype == torch.bfloat16)
    return Packing(send, perm, dest, totals.view(chunks, world))


@dataclass
class Counted:
    """A batch counted by (chunk, owner, local network) and not packed yet (`count_by_network`, then
    `pack_by_network`): the counts are all an exchange's header needs, so the sort and the packing can be queued
    after the header and run on the device while the host reads it."""
    x: torch.Tensor
    ids: torch.Tensor
    extra: torch.Tensor | None
    key: torch.Tensor
    counts: torch.Tensor
    network_counts: torch.Tensor
    layout: RowLayout
    local_table: torch.Tensor
    kernels: str


def count_by_network(x, ids, owner_table, local_table, world, chunks, n_local, kernels="auto",
                     dtype=torch.float32, extra=None) -> Counted:
    """Each sample's key (chunk, owner, local id) in the narrowest integer type its range fits (torch's GPU sort
    is a radix sort, one pass per key byte), and the samples per key: one atomic histogram of a fixed size
    (bincount on CUDA reads the largest key back to the host), in one Triton pass where it runs."""
    n_bins = world * chunks * n_local
    narrow = torch.uint8 if n_bins < 255 else torch.int16 if n_bins < 32767 else torch.int32
    n = ids.shape[0]
    dev = x.device
    if n and use_triton(kernels, dev):
        from . import bucket_kernels

        key = torch.empty(n, dtype=narrow, device=dev)
        network_counts = torch.zeros(n_bins, dtype=torch.int32, device=dev)
        block = _block(dev, 1)
        bucket_kernels.network_keys_kernel[((n + block - 1) // block,)](ids.contiguous(), owner_table, local_table, key,
                                                                        network_counts, n, chunks, world, n_local,
                                                                        BLOCK=block)
    else:
        wide = _keys_torch(ids, owner_table, world, chunks) * n_local + local_table.index_select(0, ids)
        network_counts = torch.zeros(n_bins, dtype=torch.int32, device=dev)
        network_counts.index_add_(0, wide, torch.ones((), dtype=torch.int32, device=dev).expand(n))
        key = wide.to(narrow)
    network_counts = network_counts.view(chunks, world, n_local).to(torch.int64)
    e = 0 if extra is None else extra.shape[1]
    return Counted(x, ids, extra, key, network_counts.sum(2), network_counts,
                   RowLayout.of(x.shape[1] + e, dtype), local_table, kernels)


def pack_by_network(c: Counted) -> Packing:
    """The stable sort of `count_by_network`'s keys (torch's radix sort), then one packing pass: each sample's row
    read in sample order and written at its sorted position (Triton where it runs)."""
    x, ids, extra, layout = c.x, c.ids, c.extra, c.layout
    n, d = x.shape
    dev = x.device
    _, perm = torch.sort(c.key, stable=True)
    dest = torch.empty(n, dtype=torch.int32, device=dev)
    dest.scatter_(0, perm, torch.arange(n, dtype=torch.int32, device=dev))
    send = torch.empty(n, layout.width, dtype=layout.dtype, device=dev)
    if n and use_triton(c.kernels, dev):
        from . import bucket_kernels

        e = 0 if extra is None else extra.shape[1]
        dims_block = _dims_block(d + e)
        block = _block(dev, dims_block)
        bucket_kernels.pack_at_kernel[((n + block - 1) // block,)](
            dest, ids.contiguous(), c.local_table, x.contiguous(), x if extra is None else extra.contiguous(), send,
            send.view(torch.int32), n, d, e, layout.width, layout.id_row, layout.id_col, layout.stored,
            BLOCK=block, DP=dims_block, BF16=layout.dtype == torch.bfloat16)
    else:
        _pack_rows_torch(send, layout, x, extra, c.local_table, ids, perm)
    return Packing(send, perm.to(torch.int32), dest, c.counts, c.network_counts)


def _pack_rows_torch(send, layout, x, extra, local_table, ids, index):
    """send[p] = the packed row of sample index[p]."""
    d = x.shape[1]
    send[:, :d] = x.index_select(0, index)
    if extra is not None:
        send[:, d:d + extra.shape[1]] = extra.index_select(0, index)
        d += extra.shape[1]
    send[:, d:layout.stored] = 0
    send.view(torch.int32)[:, layout.id_col] = local_table.index_select(0, ids.index_select(0, index))


@dataclass
class Merge:
    """Where an owner's received rows go so that they come grouped by local network (`merge_by_network`): rank
    s's rows start at received row `starts[s]`; row i of rank s with local id m goes to row i + delta[s, m].
    `bounds[r]`: (n_local + 1,) int64 network bounds of run r's rows, relative to the run's first row."""
    starts: torch.Tensor
    delta: torch.Tensor
    bounds: list[torch.Tensor]


def merge_by_network(network_counts: torch.Tensor, runs: list[tuple[int, int]], n_local: int,
                     kernels: str = "auto") -> Merge:
    """network_counts (world, L) int64: rows each rank sent here per local network, each rank's rows sorted by
    local id (`bucket(by_network=L)`). runs: consecutive ranges [lo, hi) of sending ranks whose rows stay apart
    (each run's rows are grouped by network among themselves, after the earlier runs' rows; one run (0, world)
    groups them all). One Triton program for one run of up to
    MAX_MERGE_PROGRAM_BINS counts (one launch instead of a dozen: the tables are computed around the header, where
    launches cost the step host time), else a handful of torch ops on (world, L) tables."""
    world, width = network_counts.shape
    dev = network_counts.device
    if len(runs) == 1 and world * width <= MAX_MERGE_PROGRAM_BINS and use_triton(kernels, dev, world):
        from . import bucket_kernels

        starts = torch.empty(world, dtype=torch.int64, device=dev)
        delta = torch.empty(world, width, dtype=torch.int64, device=dev)
        bounds = torch.empty(width + 1, dtype=torch.int64, device=dev)
        wp = max(2, 1 << (world - 1).bit_length())
        bucket_kernels.merge_kernel[(1,)](network_counts.contiguous(), starts, delta, bounds, L=width, WORLD=world,
                                          WP=wp, BN=max(16, min(1024, 2048 // wp)))
        return Merge(starts, delta, [bounds[:n_local + 1]])
    flat = network_counts.reshape(-1)
    received_at = (torch.cumsum(flat, 0) - flat).view(world, width)  # where rank s's rows of network m start
    deltas, bounds = [], []
    for lo, hi in runs:
        k = hi - lo
        by_network = network_counts[lo:hi].t().reshape(-1)  # the run's counts in merged order: network, then rank
        ends = torch.cumsum(by_network, 0).view(width, k)
        starts = ends - by_network.view(width, k)
        # The run's rows start where its first rank's rows do.
        deltas.append(starts.t() + received_at[lo, 0] - received_at[lo:hi])
        bounds.append(torch.cat([torch.zeros(1, dtype=torch.int64, device=flat.device), ends[:n_local, -1]]))
    delta = deltas[0] if len(deltas) == 1 else torch.cat(deltas)
    return Merge(received_at[:, 0].contiguous(), delta.contiguous(), bounds)


def unpack(received: torch.Tensor, kernels: str = "auto", n_input_dims: int | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A received packed buffer (n, width) as the owner's float32 inputs (n, d) and int32 local ids (n,).
    n_input_dims: d (needed for 16-bit rows; a float32 row's is its width less one)."""
    d = received.shape[1] - 1 if n_input_dims is None else n_input_dims
    x, _, ids = unpack_split(received, d, 0, kernels)
    return x, ids


def unpack_split(received: torch.Tensor, d: int, e: int, kernels: str = "auto", merge: Merge | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A received buffer packed with `extra` columns (`bucket`) as float32 inputs (n, d), the extra columns
    (n, e) and int32 local ids (n,), each contiguous, in one pass; with `merge` (`merge_by_network`), each row
    written at its place in the batch grouped by network."""
    n = received.shape[0]
    layout = RowLayout.of(d + e, received.dtype)
    dev = received.device
    words = received.view(torch.int32)
    world = 0 if merge is None else merge.starts.shape[0]
    if n and use_triton(kernels, dev, world):
        from . import bucket_kernels

        x = torch.empty(n, d, device=dev)
        extra = torch.empty(n, e, device=dev)
        ids = torch.empty(n, dtype=torch.int32, device=dev)
        block = _block(dev, _dims_block(d + e))
        starts, delta = (ids, ids) if merge is None else (merge.starts, merge.delta)
        bucket_kernels.unpack_kernel[((n + block - 1) // block,)](
            received, words, x, extra if e else x, ids, starts, delta, n, d, e, layout.width, layout.id_row,
            layout.id_col, 0 if merge is None else merge.delta.shape[1], BLOCK=block, DP=_dims_block(d + e),
            WORLD=world)
        return x, extra, ids
    rows = received[:, :d + e].to(torch.float32)
    x, extra, ids = rows[:, :d].contiguous(), rows[:, d:].contiguous(), words[:, layout.id_col].contiguous()
    if merge is None or not n:
        return x, extra, ids
    i = torch.arange(n, device=dev)
    sender = torch.searchsorted(merge.starts, i, right=True) - 1
    pos = i + merge.delta[sender, ids.long()]
    out = [torch.empty_like(t) for t in (x, extra, ids)]
    for o, t in zip(out, (x, extra, ids)):
        o[pos] = t
    return tuple(out)


def gather_rows(src: torch.Tensor, index: torch.Tensor, scale: float = 1.0, kernels: str = "auto",
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """out[i] = src[index[i]] * scale in `dtype` (one pass): src rows of any exchange dtype, the product taken
    in float32 and rounded once to `dtype`."""
    n = index.shape[0]
    d = src.shape[1]
    dev = src.device
    if n and d and use_triton(kernels, dev):
        from ..kernels.row_gather import gather_rows as gather
        return gather(src, index, scale, dtype)
    out = src.index_select(0, index)
    if scale != 1.0:
        out = out.to(torch.float32).mul_(scale)
    return out.to(dtype)

"""The multiresolution grid's lookup and table gradient as Triton launches on CUDA: the same arithmetic as
`grid_encoding.grid_forward` and `grid_encoding.grid_backward_lanes` (Taichi), for float32 tables (the lookup also
for compact bfloat16 ones) and the prime or base-convert hashes. Imported only where Triton runs (CUDA, or its CPU
interpreter in tests).

Why a second copy: a training step with a grid issues its lookup and its table gradient every step, and Taichi's
launch path costs the host several times a Triton launch's time for the same arguments (design notes, "The grid's
hot launches through Triton"); on the GPU the two versions do the same loads and atomics. Taichi's kernels stay the
CPU's, the reference of the tests, and the path of every option this one leaves out (compact tables, input
gradients, second order, the fixed-order sum, stochastic interpolation, the Rng hash).

One program covers `BLOCK` samples of one level (levels on the launch grid's second axis, so neighbouring
programs read the same level's table, as the Taichi kernels' level-major threads do). Table rows are chunk views
(tinn/chunks.py): row `net_ids[b] - net_lo` of the view, skipped when outside it. Features travel feature-major,
`out_t[level * F + f, b]`, as in the Taichi kernels. Index arithmetic is tcnn's, in uint32 with wraparound. The
kernels take grid_encoding's codes: interpolation 0 Nearest, 1 Linear, 2 Smoothstep; grid type 0 Hash; hash
combination (grid_layout.hash_code) 0 XOR, 1 sum.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import triton_interpreted
from .grid_encoding import MAX_DENSE_BASE

BLOCK = 128  # samples a forward program covers; (sample, feature) lanes a backward program covers


@triton.jit
def _axis(x_ptr, b64, inside, scale, zf, d: tl.constexpr, D: tl.constexpr, INTERP: tl.constexpr):
    """Cell coordinate, interpolation weight and NaN flag of each sample along axis `d` (zeros past `D`); the
    +0.5 staggers the levels against each other (tcnn)."""
    p = zf
    if d < D:
        p = tl.load(x_ptr + b64 * D + d, mask=inside, other=0.0) * scale + 0.5
    fl = tl.floor(p)
    t = p - fl
    if INTERP == 2:  # Smoothstep
        t = t * t * (3.0 - 2.0 * t)
    return fl.to(tl.int32), t, (p != p)


@triton.jit
def _add_axis(index, stride, hashed_index, c, corner: tl.constexpr, d: tl.constexpr, res_u, factors_ptr,
              H: tl.constexpr):
    """Axis `d` of a corner's vertex added to its dense index (coordinate times the stride so far) and to its hash
    (the coordinate times the axis' factor, XOR-ed or summed); returns (index, next stride, hash)."""
    u = (c + ((corner >> d) & 1)).to(tl.uint32, bitcast=True)
    term = u * tl.load(factors_ptr + d).to(tl.uint32, bitcast=True)
    hashed_index = (hashed_index + term) if H == 1 else (hashed_index ^ term)
    return index + u * stride, stride * res_u, hashed_index


@triton.jit
def _corner_entry(c0, c1, c2, c3, corner: tl.constexpr, res_u, size_u, hashed, pow2, factors_ptr,
                  D: tl.constexpr, H: tl.constexpr):
    """The table entry (uint32 block) of `corner` of each sample's cell: the dense index where the level's
    vertices fit in 32 bits and the level is not hashed, else tcnn's spatial hash, wrapped to the level's size."""
    zero = res_u * 0
    index, stride, hashed_index = _add_axis(zero, zero + 1, zero, c0, corner, 0, res_u, factors_ptr, H)
    if D > 1:
        index, stride, hashed_index = _add_axis(index, stride, hashed_index, c1, corner, 1, res_u, factors_ptr, H)
    if D > 2:
        index, stride, hashed_index = _add_axis(index, stride, hashed_index, c2, corner, 2, res_u, factors_ptr, H)
    if D > 3:
        index, stride, hashed_index = _add_axis(index, stride, hashed_index, c3, corner, 3, res_u, factors_ptr, H)
    index = tl.where(hashed, hashed_index, index)
    wrapped = tl.where(pow2, index & (size_u - 1), index % tl.maximum(size_u, 1))
    return tl.where(index >= size_u, wrapped, index)


@triton.jit
def _weight(s0, s1, s2, s3, corner: tl.constexpr, D: tl.constexpr):
    """The N-linear weight of `corner` (from each axis' weight s or 1 - s)."""
    w = s0 if (corner & 1) else 1.0 - s0
    if D > 1:
        w = w * (s1 if ((corner >> 1) & 1) else 1.0 - s1)
    if D > 2:
        w = w * (s2 if ((corner >> 2) & 1) else 1.0 - s2)
    if D > 3:
        w = w * (s3 if ((corner >> 3) & 1) else 1.0 - s3)
    return w


@triton.jit
def _level(x_ptr, ids_ptr, meta_ptr, level, n, n_rows, net_lo, row_stride, param_offset, grid_type, b,
           D: tl.constexpr, F: tl.constexpr, INTERP: tl.constexpr, DENSE_LIMIT: tl.constexpr):
    """What both kernels compute first for their level and samples `b` (a block): the samples' rows in the view,
    cells and per-axis weights, and the level's table constants."""
    zeros = b * 0
    inside = b < n
    net = tl.load(ids_ptr + b, mask=inside, other=0) - net_lo
    live = inside & (net >= 0) & (net < n_rows)
    first = tl.load(meta_ptr + level * 4)
    res = tl.load(meta_ptr + level * 4 + 1)
    size = tl.load(meta_ptr + level * 4 + 2)
    scale = tl.load(meta_ptr + level * 4 + 3).to(tl.float32, bitcast=True)
    b64 = b.to(tl.int64)
    zf = zeros.to(tl.float32)
    c0, s0, n0 = _axis(x_ptr, b64, inside, scale, zf, 0, D, INTERP)
    c1, s1, n1 = _axis(x_ptr, b64, inside, scale, zf, 1, D, INTERP)
    c2, s2, n2 = _axis(x_ptr, b64, inside, scale, zf, 2, D, INTERP)
    c3, s3, n3 = _axis(x_ptr, b64, inside, scale, zf, 3, D, INTERP)
    res_u = (zeros + res).to(tl.uint32, bitcast=True)
    size_u = (zeros + size).to(tl.uint32, bitcast=True)
    # The level's dense vertex count res^D in uint32 (0xFFFFFFFF past the resolution that keeps it in 32 bits);
    # a hashed type hashes where its table is smaller than that.
    dense = res_u
    for _ in tl.static_range(D - 1):
        dense = dense * res_u
    dense = tl.where(res_u <= DENSE_LIMIT, dense, (zeros - 1).to(tl.uint32, bitcast=True))
    hashed = (zeros + grid_type == 0) & (size_u < dense)
    pow2 = (size_u & (size_u - 1)) == 0
    row = net.to(tl.int64) * row_stride + param_offset + first * F
    return live, n0 | n1 | n2 | n3, c0, c1, c2, c3, s0, s1, s2, s3, res_u, size_u, hashed, pow2, row


@triton.jit
def _table_values(table_ptr, cols, live, BF16: tl.constexpr):
    """Float32 values at table columns `cols` (a [samples, F] block) of the samples `live`; a compact table holds
    bfloat16 bits in int16."""
    values = tl.load(table_ptr + cols, mask=live, other=0)
    if BF16:
        values = values.to(tl.bfloat16, bitcast=True)
    return values.to(tl.float32)


@triton.jit
def _grid_forward(x_ptr, ids_ptr, table_ptr, meta_ptr, factors_ptr, out_ptr, n, n_rows, net_lo, row_stride,
                  param_offset, grid_type, D: tl.constexpr, F: tl.constexpr, INTERP: tl.constexpr, H: tl.constexpr,
                  BF16: tl.constexpr, BLOCK: tl.constexpr, DENSE_LIMIT: tl.constexpr):
    level = tl.program_id(1)
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live, nan, c0, c1, c2, c3, s0, s1, s2, s3, res_u, size_u, hashed, pow2, row = _level(
        x_ptr, ids_ptr, meta_ptr, level, n, n_rows, net_lo, row_stride, param_offset, grid_type, b,
        D, F, INTERP, DENSE_LIMIT)
    f = tl.arange(0, F)
    if INTERP == 0:  # Nearest: corner 0 alone; a NaN coordinate gives NaN features, as torch ops would
        e = _corner_entry(c0, c1, c2, c3, 0, res_u, size_u, hashed, pow2, factors_ptr, D, H)
        cols = row + e.to(tl.int64) * F
        acc = _table_values(table_ptr, cols[:, None] + f[None, :], live[:, None], BF16)
        acc = tl.where(nan[:, None], float("nan"), acc)
    else:
        acc = tl.zeros([BLOCK, F], dtype=tl.float32)
        for corner in tl.static_range(1 << D):
            e = _corner_entry(c0, c1, c2, c3, corner, res_u, size_u, hashed, pow2, factors_ptr, D, H)
            w = _weight(s0, s1, s2, s3, corner, D)
            cols = row + e.to(tl.int64) * F
            values = _table_values(table_ptr, cols[:, None] + f[None, :], live[:, None], BF16)
            acc += w[:, None] * values
    out = out_ptr + (level * F + f)[None, :].to(tl.int64) * n + b[:, None]
    tl.store(out, acc, mask=live[:, None])


@triton.jit
def _grid_backward_table(x_ptr, ids_ptr, meta_ptr, factors_ptr, dy_ptr, grad_ptr, n, n_rows, net_lo, row_stride,
                         param_offset, grid_type, D: tl.constexpr, F: tl.constexpr, INTERP: tl.constexpr,
                         H: tl.constexpr, BLOCK: tl.constexpr, DENSE_LIMIT: tl.constexpr):
    # One lane per (sample, feature), features of a sample on neighbouring lanes: a corner's F adds then go to
    # neighbouring words from neighbouring threads and reach L2 as one request (the Taichi kernel's feature lanes).
    # The lanes of one sample repeat its cell's arithmetic, which costs less than the requests it saves.
    level = tl.program_id(1)
    lane = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    b = (lane // F).to(tl.int32)
    f = (lane % F).to(tl.int32)
    live, nan, c0, c1, c2, c3, s0, s1, s2, s3, res_u, size_u, hashed, pow2, row = _level(
        x_ptr, ids_ptr, meta_ptr, level, n, n_rows, net_lo, row_stride, param_offset, grid_type, b,
        D, F, INTERP, DENSE_LIMIT)
    dy = tl.load(dy_ptr + (level * F + f).to(tl.int64) * n + b, mask=live, other=0.0)
    # Zero upstream gradients add nothing: skipped, as the Taichi kernels skip them (fewer atomics).
    send = live & (dy != 0.0)
    row = row + f
    if INTERP == 0:
        e = _corner_entry(c0, c1, c2, c3, 0, res_u, size_u, hashed, pow2, factors_ptr, D, H)
        tl.atomic_add(grad_ptr + row + e.to(tl.int64) * F, dy, mask=send, sem="relaxed")
    else:
        for corner in tl.static_range(1 << D):
            e = _corner_entry(c0, c1, c2, c3, corner, res_u, size_u, hashed, pow2, factors_ptr, D, H)
            w = _weight(s0, s1, s2, s3, corner, D)
            tl.atomic_add(grad_ptr + row + e.to(tl.int64) * F, w * dy, mask=send, sem="relaxed")


@triton.jit
def _reduce_v2(ptr, a, b, send, ASM: tl.constexpr):
    """ptr[0:2] += (a, b) where `send` is nonzero: one vector reduction (`red.global.add.v2.f32`, sm_90) on the GPU,
    two atomics in Triton's interpreter (which runs no assembly)."""
    if ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $4, 0; @p red.relaxed.gpu.global.add.v2.f32 [$1], {$2, $3}; "
            "mov.b32 $0, 0; }",
            "=r,l,f,f,r", [ptr.to(tl.int64), a, b, send], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.atomic_add(ptr, a, mask=send != 0, sem="relaxed")
        tl.atomic_add(ptr + 1, b, mask=send != 0, sem="relaxed")


@triton.jit
def _reduce_v4(ptr, a, b, c, d, send, ASM: tl.constexpr):
    """ptr[0:4] += (a, b, c, d) where `send` is nonzero (`red.global.add.v4.f32` on the GPU, as `_reduce_v2`)."""
    if ASM:
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $6, 0; @p red.relaxed.gpu.global.add.v4.f32 [$1], {$2, $3, $4, $5}; "
            "mov.b32 $0, 0; }",
            "=r,l,f,f,f,f,r", [ptr.to(tl.int64), a, b, c, d, send], dtype=tl.int32, is_pure=False, pack=1)
    else:
        _reduce_v2(ptr, a, b, send, ASM)
        _reduce_v2(ptr + 2, c, d, send, ASM)


@triton.jit
def _add_features(ptr, dy_ptr, dy_row, n, b, w, live, F: tl.constexpr, ASM: tl.constexpr):
    """A corner's F feature gradients w * dy added at ptr[0:F] (F in 2, 4, 8), in vector reductions of up to four
    words; lanes whose every dy is zero send nothing (fewer requests, as the lanes kernel skips zero dy)."""
    b64 = b.to(tl.int64)
    if F == 2:
        g0 = tl.load(dy_ptr + dy_row * n + b64, mask=live, other=0.0)
        g1 = tl.load(dy_ptr + (dy_row + 1) * n + b64, mask=live, other=0.0)
        _reduce_v2(ptr, w * g0, w * g1, (live & ((g0 != 0.0) | (g1 != 0.0))).to(tl.int32), ASM)
    else:
        for v in tl.static_range(F // 4):
            g0 = tl.load(dy_ptr + (dy_row + 4 * v) * n + b64, mask=live, other=0.0)
            g1 = tl.load(dy_ptr + (dy_row + 4 * v + 1) * n + b64, mask=live, other=0.0)
            g2 = tl.load(dy_ptr + (dy_row + 4 * v + 2) * n + b64, mask=live, other=0.0)
            g3 = tl.load(dy_ptr + (dy_row + 4 * v + 3) * n + b64, mask=live, other=0.0)
            send = (live & ((g0 != 0.0) | (g1 != 0.0) | (g2 != 0.0) | (g3 != 0.0))).to(tl.int32)
            _reduce_v4(ptr + 4 * v, w * g0, w * g1, w * g2, w * g3, send, ASM)


@triton.jit
def _grid_backward_vector(x_ptr, ids_ptr, meta_ptr, factors_ptr, dy_ptr, grad_ptr, private_ptr, n, n_rows, net_lo,
                          row_stride, param_offset, grid_type, n_private, private_floats, copies, D: tl.constexpr,
                          F: tl.constexpr, INTERP: tl.constexpr, H: tl.constexpr, BLOCK: tl.constexpr,
                          DENSE_LIMIT: tl.constexpr, ASM: tl.constexpr, PAIRS: tl.constexpr):
    # One lane per sample: its cell's arithmetic once, then one vector reduction of its F features per corner,
    # where a lane per feature sends F scalar atomics that the L2 processes one by one. Levels below `n_private`
    # (the coarse levels of a grid or of a few grids, whose few entries take every sample's adds) add into copy
    # (program % copies) of a private buffer instead, one per network of the view, spreading those adds over
    # `copies` times more addresses; `_sum_private` then adds the copies into the table's gradient.
    # PAIRS (two features, 16-byte aligned entry pairs): the two corners of a cell that differ along the first
    # axis land on the entries 2j and 2j + 1 whenever the first coordinate is even, in the dense index and in
    # tcnn's hashes alike (that axis' factor is 1, and the wrap keeps bit 0), so both go in one four-word
    # reduction: a quarter fewer L2 requests on average.
    level = tl.program_id(1)
    b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live, nan, c0, c1, c2, c3, s0, s1, s2, s3, res_u, size_u, hashed, pow2, row = _level(
        x_ptr, ids_ptr, meta_ptr, level, n, n_rows, net_lo, row_stride, param_offset, grid_type, b,
        D, F, INTERP, DENSE_LIMIT)
    base = grad_ptr + row
    if level < n_private:
        # Copy (program % copies) of the sample's network: private[copy, net] mirrors the start of its row.
        copy = (tl.program_id(0) % copies).to(tl.int64)
        net = (tl.load(ids_ptr + b, mask=b < n, other=0) - net_lo).to(tl.int64)
        base = private_ptr + ((copy * n_rows + net) * private_floats + tl.load(meta_ptr + level * 4).to(tl.int64) * F)
    dy_row = (level * F).to(tl.int64)
    if INTERP == 0:
        e = _corner_entry(c0, c1, c2, c3, 0, res_u, size_u, hashed, pow2, factors_ptr, D, H)
        _add_features(base + e.to(tl.int64) * F, dy_ptr, dy_row, n, b, 1.0, live, F, ASM)
    elif PAIRS:
        b64 = b.to(tl.int64)
        g0 = tl.load(dy_ptr + dy_row * n + b64, mask=live, other=0.0)
        g1 = tl.load(dy_ptr + (dy_row + 1) * n + b64, mask=live, other=0.0)
        send = live & ((g0 != 0.0) | (g1 != 0.0))
        for pair in tl.static_range(1 << (D - 1)):
            ea = _corner_entry(c0, c1, c2, c3, 2 * pair, res_u, size_u, hashed, pow2, factors_ptr, D, H)
            eb = _corner_entry(c0, c1, c2, c3, 2 * pair + 1, res_u, size_u, hashed, pow2, factors_ptr, D, H)
            wa = _weight(s0, s1, s2, s3, 2 * pair, D)
            wb = _weight(s0, s1, s2, s3, 2 * pair + 1, D)
            paired = eb == (ea ^ 1)
            a_first = (ea & 1) == 0
            w_lo = tl.where(a_first, wa, wb)
            w_hi = tl.where(a_first, wb, wa)
            lo = tl.minimum(ea, eb).to(tl.int64)
            _reduce_v4(base + lo * 2, w_lo * g0, w_lo * g1, w_hi * g0, w_hi * g1, (send & paired).to(tl.int32),
                       ASM)
            apart = (send & (eb != (ea ^ 1))).to(tl.int32)
            _reduce_v2(base + ea.to(tl.int64) * 2, wa * g0, wa * g1, apart, ASM)
            _reduce_v2(base + eb.to(tl.int64) * 2, wb * g0, wb * g1, apart, ASM)
    else:
        for corner in tl.static_range(1 << D):
            e = _corner_entry(c0, c1, c2, c3, corner, res_u, size_u, hashed, pow2, factors_ptr, D, H)
            w = _weight(s0, s1, s2, s3, corner, D)
            _add_features(base + e.to(tl.int64) * F, dy_ptr, dy_row, n, b, w, live, F, ASM)


@triton.jit
def _sum_private(private_ptr, grad_ptr, private_floats, copies, n_rows, row_stride, offset, BLOCK: tl.constexpr,
                 COPIES: tl.constexpr):
    """grad[row, offset + i] += the sum over the copies of private[copy, row, i] (after `_grid_backward_vector`, in
    stream order: nothing else writes these entries meanwhile, so a plain read and write). A program loads its
    values of every copy at once (a (COPIES, BLOCK) tile) and sums them in registers: a loop over the copies would
    wait on one load after another."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    r = tl.program_id(1).to(tl.int64)
    k = tl.arange(0, COPIES)
    inside = i < private_floats
    values = tl.load(private_ptr + (k[:, None].to(tl.int64) * n_rows + r) * private_floats + i[None, :],
                     mask=(k[:, None] < copies) & inside[None, :], other=0.0)
    target = grad_ptr + r * row_stride + offset + i
    tl.store(target, tl.load(target, mask=inside, other=0.0) + tl.sum(values, axis=0), mask=inside)


# A grid's coarse levels summed in private copies: each level at most this many values (the dense levels where
# many samples share an entry), and this many copies for a single grid. An array of up to PRIVATE_MAX_NETWORKS
# grids (an octree's nodes) shares the copies out, each network's samples spread over about as many as a single
# grid's would be (its share of the batch over its share of the copies); larger arrays spread their samples over
# enough networks without them.
PRIVATE_MAX_FLOATS = 16384
PRIVATE_COPIES = 64
PRIVATE_MAX_NETWORKS = 32
SUM_TILE = 2048  # values a program of `_sum_private` loads: its block of values times the copies


def private_copies(n_rows: int) -> int:
    """Private copies for a table gradient over `n_rows` grids (0: none)."""
    if n_rows < 1 or n_rows > PRIVATE_MAX_NETWORKS:
        return 0
    return -(-PRIVATE_COPIES // n_rows)


def private_levels(levels: "LevelTable", F: int) -> tuple[int, int]:
    """(levels, floats): how many leading (coarse) levels a private copy holds, each of at most PRIVATE_MAX_FLOATS
    values, and the values of one copy (the levels are the table's first, so a copy mirrors its start). Worked out
    once per table, feature count and limit: every training step's table gradient asks."""
    key = (F, PRIVATE_MAX_FLOATS)
    known = levels.private.get(key)
    if known is None:
        count, floats = 0, 0
        for first, _, size, _ in levels.host[:-1]:
            if int(size) * F > PRIVATE_MAX_FLOATS:
                break
            count, floats = count + 1, (int(first) + int(size)) * F
        known = levels.private[key] = (count, floats)
    return known


# Corner pairs in one four-word reduction (`_grid_backward_vector`'s PAIRS) where the alignment allows.
PAIRED_CORNERS = True


def paired_corners(F: int, interp: int, dtable: torch.Tensor, param_offset: int, levels: "LevelTable",
                   private_floats: int) -> bool:
    """Whether the vector table gradient can add a cell's corner pairs in four-word reductions: two features,
    linear or smooth interpolation, and every entry pair 16 bytes aligned (the table's start, its row stride,
    the offset, each level's first entry and each private copy's size)."""
    return (PAIRED_CORNERS and F == 2 and interp != 0 and dtable.data_ptr() % 16 == 0 and param_offset % 4 == 0
            and (dtable.shape[0] == 1 or dtable.stride(0) % 4 == 0) and levels.even_starts
            and private_floats % 4 == 0)


def vector_reductions(F: int, dtable: torch.Tensor, param_offset: int) -> bool:
    """Whether the table gradient into `dtable` can add a sample's features with vector reductions: 2, 4 or 8
    features, each corner's values aligned to the vector's size (table start, row stride and offset)."""
    width = 2 if F == 2 else 4
    return (F in (2, 4, 8) and dtable.data_ptr() % (4 * width) == 0 and param_offset % width == 0
            and (dtable.shape[0] == 1 or dtable.stride(0) % width == 0))


class LevelTable:
    """The per-level table (tinn/kernels/grid_encoding.py's `meta`, a numpy int32 array) on a device, with its
    last row (the hash factors) as a view made once: every launch passes both."""

    def __init__(self, meta, device):
        self.host = meta
        self.private = {}  # (features, PRIVATE_MAX_FLOATS) -> `private_levels`
        self.even_starts = all(int(row[0]) % 2 == 0 for row in meta[:-1])
        self.meta = torch.as_tensor(meta, dtype=torch.int32).to(device).contiguous()
        self.factors = self.meta[-1]
        self.n_levels = self.meta.shape[0] - 1
        self.device = self.meta.device


def _scalars(x, table, param_offset, grid_type, net_lo):
    return x.shape[0], table.shape[0], net_lo, table.stride(0), param_offset, grid_type


def grid_forward(x, net_ids, table, param_offset, levels: LevelTable, out_t, F, interp, grid_type, D, net_lo,
                 hashing):
    """`out_t[level * F + f, b]` = sample b's features, for the samples whose row lies in the view `table`
    (as `grid_encoding.grid_forward`; a float32 table, or a compact one's bfloat16 values; `hashing` HASH_XOR or
    HASH_SUM)."""
    grid = (triton.cdiv(x.shape[0], BLOCK), levels.n_levels)
    compact = table.dtype == torch.bfloat16
    _grid_forward[grid](x, net_ids, table.view(torch.int16) if compact else table, levels.meta, levels.factors,
                        out_t, *_scalars(x, table, param_offset, grid_type, net_lo), D=D, F=F, INTERP=interp,
                        H=hashing, BF16=compact, BLOCK=BLOCK, DENSE_LIMIT=MAX_DENSE_BASE[D])


def grid_backward_table(x, net_ids, param_offset, levels: LevelTable, dy_t, dtable, F, interp, grid_type, D, net_lo,
                        hashing, vector: bool = False, copies: int = 0):
    """Adds every level's table gradient into the view `dtable` (atomics; as `grid_encoding.grid_backward_lanes`).
    `vector` (see `vector_reductions`): a lane per sample adding its features with vector reductions; `copies`
    (with `vector`, `private_copies` of the view's grids): their coarse levels summed in that many private copies
    per grid first."""
    if vector:
        rows = dtable.shape[0]
        n_private, private_floats = private_levels(levels, F) if copies else (0, 0)
        private = (torch.zeros(copies, rows, private_floats, dtype=torch.float32, device=x.device) if n_private
                   else dtable)
        grid = (triton.cdiv(x.shape[0], BLOCK), levels.n_levels)
        _grid_backward_vector[grid](x, net_ids, levels.meta, levels.factors, dy_t, dtable, private,
                                    *_scalars(x, dtable, param_offset, grid_type, net_lo), n_private,
                                    private_floats, max(copies, 1), D=D, F=F, INTERP=interp, H=hashing, BLOCK=BLOCK,
                                    DENSE_LIMIT=MAX_DENSE_BASE[D], ASM=not triton_interpreted(),
                                    PAIRS=paired_corners(F, interp, dtable, param_offset, levels, private_floats))
        if n_private:
            copies_block = triton.next_power_of_2(copies)
            block = max(16, SUM_TILE // copies_block)
            _sum_private[(triton.cdiv(private_floats, block), rows)](private, dtable, private_floats, copies, rows,
                                                                     dtable.stride(0), param_offset, BLOCK=block,
                                                                     COPIES=copies_block)
        return
    grid = (triton.cdiv(x.shape[0] * F, BLOCK), levels.n_levels)
    _grid_backward_table[grid](x, net_ids, levels.meta, levels.factors, dy_t, dtable,
                               *_scalars(x, dtable, param_offset, grid_type, net_lo), D=D, F=F, INTERP=interp,
                               H=hashing, BLOCK=BLOCK, DENSE_LIMIT=MAX_DENSE_BASE[D])

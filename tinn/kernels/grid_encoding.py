"""Multiresolution grid encoding kernels (hash / dense / tiled), one grid per network.

Layout (see tinn/encodings/grid_layout.py): `params[net, param_offset + level_offset*F + entry*F + f]`.
Per-level numbers come in as one small int32 table computed on the host, `meta` (n_levels + 1, 4):
row l < n_levels = (entry_offset, resolution, n_entries, float32 bits of scale); the last row holds the
hash's per-dimension factors. How they combine (`H`, tinn/encodings/grid_layout.py: `hash_code`) is a
template argument of every kernel. One table instead of three because every ndarray argument costs host time per launch,
which matters for the small batches of many tiny networks.

Threads run over (level, sample) with the level outermost, so neighbouring threads
read the same level's table and it stays in cache (tcnn launches one level per block
row for the same reason). For the same reason features travel feature-major
(`out_t[level*F + f, sample]`, `dy_t` likewise): neighbouring threads then write/read
neighbouring addresses; a consumer that wants sample-major rows gets one transpose.

The number of input dims `D` and of features per level `F` are templates: the corner and feature
loops unroll, so table offsets are constants and the per-dimension values stay in registers.
Everything else (levels, resolutions, interpolation,
grid type) is a runtime argument, so one instance per (D, F) pair in use is compiled. The
second-order kernel keeps F dynamic: it is a rare path.

Atomics: parameter gradients are scattered with float32 atomics (tcnn's fp16 ones would lose
precision here). Contention is kept down by the level-major order (a warp's adds go to one
level's cache-resident table), by skipping zero upstream gradients, and by reducing the input
gradient over corners and features in registers (one add per level and dim). Coarse levels
still take many adds per entry. On CUDA, for a single grid, `grid_backward_shared` takes
the coarse levels whose table fits in a block's shared memory: a block sums the gradient of
a few thousand samples into a shared copy of the level, then adds each touched entry to
global memory once (shared atomics are on-chip; global ones to a few hundred hot entries
serialise). Grid arrays keep the global atomics (a block's samples may belong to several
grids), and so does the CPU (block.sync() does not compile there). When the inputs need no
gradient, the other levels run one thread per (level, sample, feature) (`grid_backward_lanes`,
on CUDA fused with the shared-memory levels in `grid_backward_params`): a corner's F adds then
come from neighbouring threads to neighbouring words and reach L2 as one request.
"""
from ..backend import ti

from . import pcg32
from .compact import bf16_value
from .launch import fast_kernel
from .rows import in_chunk

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
table_2d = ti.types.ndarray(ndim=2)  # float32, or int16 holding bfloat16 bits (a compact table)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)

NEAREST, LINEAR, SMOOTHSTEP = 0, 1, 2
HASH, DENSE, TILED = 0, 1, 2
HASH_XOR, HASH_SUM, HASH_RNG = 0, 1, 2  # tinn/encodings/grid_layout.py: hash_code
# Largest resolution per dimension count whose dense stride res^D fits in uint32.
MAX_DENSE_BASE = (0x0, 0xFFFFFFFF, 0xFFFF, 0x659, 0xFF)


def make_table(values):
    """A persistent int32 Taichi ndarray on the backend's device holding `values` (a 2-D numpy array)."""
    table = ti.ndarray(dtype=ti.i32, shape=values.shape)
    # Element by element rather than `from_numpy`: that launches a Taichi kernel of its own, one more to
    # compile at start-up for a table of a few dozen integers.
    rows, cols = values.shape
    for i in range(rows):
        for j in range(cols):
            table[i, j] = int(values[i, j])
    return table


@ti.func
def _lattice(x: ti.template(), b, scale, D: ti.template()):
    """Cell origin and fractional position; the +0.5 staggers levels against each other (tcnn)."""
    cell = ti.Vector([0] * D, dt=ti.i32)
    frac = ti.Vector([0.0] * D, dt=ti.f32)
    for d in ti.static(range(D)):
        p = x[b, d] * scale + 0.5
        fl = ti.floor(p)
        cell[d] = ti.cast(fl, ti.i32)
        frac[d] = p - fl
    return cell, frac


@ti.func
def _smooth(frac, interp, D: ti.template()):
    """Interpolation weight s(t) and its first/second derivatives per dimension."""
    s = frac
    ds = ti.Vector([1.0] * D, dt=ti.f32)
    dds = ti.Vector([0.0] * D, dt=ti.f32)
    if interp == SMOOTHSTEP:
        for d in ti.static(range(D)):
            t = frac[d]
            s[d] = t * t * (3.0 - 2.0 * t)
            ds[d] = 6.0 * t * (1.0 - t)
            dds[d] = 6.0 - 12.0 * t
    return s, ds, dds


@ti.func
def _hash(cell, corner, meta: ti.template(), D: ti.template(), H: ti.template()):
    """tcnn's grid hash `H` of a cell corner (uint32 wraparound): the XOR of coordinate * factor (the prime
    hashes), their sum (BaseConvert), or PCG32 seeded 1337, jumped by the coordinates packed into 64 bits
    (64 // D bits apart, XOR-ed) and read once (Rng). `H` is a template: the Rng's jump loop would triple
    the compile time of every grid kernel that does not use it."""
    last = meta.shape[0] - 1
    h = ti.u32(0)
    if ti.static(H == HASH_RNG):
        step = ti.u64(0)
        for d in ti.static(range(D)):
            step ^= ti.cast(ti.cast(cell[d] + ((corner >> d) & 1), ti.u32), ti.u64) << ti.u64(d * (64 // D))
        h = pcg32.uint_after(step)
    else:
        for d in ti.static(range(D)):
            term = ti.cast(cell[d] + ((corner >> d) & 1), ti.u32) * ti.cast(meta[last, d], ti.u32)
            if ti.static(H == HASH_SUM):
                h += term
            else:
                h ^= term
    return h


@ti.func
def _entry(cell, corner, res, size, grid_type, meta: ti.template(), D: ti.template(), H: ti.template()):
    """Table entry of a cell corner: dense index when it fits, spatial hash otherwise (uint32 wraparound)."""
    size_u = ti.cast(size, ti.u32)
    res_u = ti.cast(res, ti.u32)
    stride = ti.u32(1)
    index = ti.u32(0)
    if res_u <= ti.u32(MAX_DENSE_BASE[D]):
        for d in ti.static(range(D)):
            index += ti.cast(cell[d] + ((corner >> d) & 1), ti.u32) * stride
            stride *= res_u
    else:
        stride = ti.u32(0xFFFFFFFF)
    if grid_type == HASH and size_u < stride:
        index = _hash(cell, corner, meta, D, H)
    # Dense levels that fit are already in range; hashed tables are powers of two (tcnn's sizes), so a
    # mask replaces the 32-bit division that `%` costs on a GPU. Same result as `index % size` always.
    if index >= size_u:
        if size_u & (size_u - ti.u32(1)) == ti.u32(0):
            index &= size_u - ti.u32(1)
        else:
            index %= size_u
    return ti.cast(index, ti.i32)


@ti.func
def _weight(s, c: ti.template(), D: ti.template()):
    w = 1.0
    for d in ti.static(range(D)):
        if ti.static((c >> d) & 1):
            w *= s[d]
        else:
            w *= 1.0 - s[d]
    return w


@ti.func
def _dweight(s, ds, c: ti.template(), k: ti.template(), D: ti.template()):
    """d(corner weight)/d(frac_k)."""
    w = 1.0
    for d in ti.static(range(D)):
        if ti.static(d == k):
            if ti.static((c >> d) & 1):
                w *= ds[d]
            else:
                w *= -ds[d]
        elif ti.static((c >> d) & 1):
            w *= s[d]
        else:
            w *= 1.0 - s[d]
    return w


@ti.func
def _level_at(x: ti.template(), b, level, meta: ti.template(), param_offset, F: ti.template(), D: ti.template()):
    """Level `level` at sample b: (scale, resolution, table size, the level's first table column, cell, frac)."""
    scale = ti.bit_cast(meta[level, 3], ti.f32)
    cell, frac = _lattice(x, b, scale, D)
    return scale, meta[level, 1], meta[level, 2], param_offset + meta[level, 0] * F, cell, frac


@ti.func
def _corners(cell, s, res, size, base, grid_type, meta: ti.template(), F: ti.template(), D: ti.template(),
             H: ti.template()):
    """Table column of each corner's first feature, and the corner's interpolation weight."""
    idx = ti.Vector([0] * (1 << D), dt=ti.i32)
    w = ti.Vector([0.0] * (1 << D), dt=ti.f32)
    for c in ti.static(range(1 << D)):
        idx[c] = base + _entry(cell, c, res, size, grid_type, meta, D, H) * F
        w[c] = _weight(s, c, D)
    return idx, w


@ti.func
def table_value(params: ti.template(), net, i, BF16: ti.template()):
    """Element (net, i) of a grid table as float32: a float32 table, or a compact one (bfloat16 bits)."""
    value = 0.0
    if ti.static(BF16):
        value = bf16_value(params[net, i])
    else:
        value = params[net, i]
    return value


@ti.func
def _input_gradient(params: ti.template(), net, idx, s, ds, dy_t: ti.template(), col, b, scale, F: ti.template(),
                    D: ti.template(), BF16: ti.template()):
    """d(level's features . dy)/dx of sample b: the corner values dotted with dy, times the weights' slopes."""
    vg = ti.Vector([0.0] * (1 << D), dt=ti.f32)
    for f in ti.static(range(F)):
        g = dy_t[col + f, b]
        for c in ti.static(range(1 << D)):
            vg[c] += g * table_value(params, net, idx[c] + f, BF16)
    g_x = ti.Vector([0.0] * D, dt=ti.f32)
    for k in ti.static(range(D)):
        acc = 0.0
        for c in ti.static(range(1 << D)):
            acc += vg[c] * _dweight(s, ds, c, k, D)
        g_x[k] = acc * scale
    return g_x


@fast_kernel(ir_passes=False)
@ti.kernel
def grid_forward(x: f32_2d, net_ids: i32_1d, params: table_2d, param_offset: ti.i32, meta: i32_2d, out_t: f32_2d,
                 F: ti.template(), interp: ti.i32, grid_type: ti.i32, D: ti.template(), net_lo: ti.i32,
                 BF16: ti.template(), H: ti.template()):
    """out_t[level * F + f, b] = features (feature-major), for the samples whose grid lies in the chunk view
    `params` (rows net_lo...; tinn/chunks.py); BF16: the table is compact (int16 bfloat16 bits)."""
    for level, b in ti.ndrange(meta.shape[0] - 1, x.shape[0]):
        net = net_ids[b] - net_lo
        if in_chunk(net, params):
            scale, res, size, base, cell, frac = _level_at(x, b, level, meta, param_offset, F, D)
            col = level * F
            if interp == NEAREST:
                e = base + _entry(cell, 0, res, size, grid_type, meta, D, H) * F
                # A NaN coordinate gives NaN features, as torch ops would (the linear weights carry it anyway).
                nan = ti.math.isnan(frac).any()
                for f in ti.static(range(F)):
                    out_t[col + f, b] = ti.select(nan, ti.math.nan, table_value(params, net, e + f, BF16))
            else:
                s, ds, dds = _smooth(frac, interp, D)
                idx, w = _corners(cell, s, res, size, base, grid_type, meta, F, D, H)
                for f in ti.static(range(F)):
                    acc = 0.0
                    for c in ti.static(range(1 << D)):
                        acc += w[c] * table_value(params, net, idx[c] + f, BF16)
                    out_t[col + f, b] = acc


@fast_kernel
@ti.kernel
def grid_backward(x: f32_2d, net_ids: i32_1d, params: f32_2d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d,
                  dparams: f32_2d, dx: f32_2d, F: ti.template(), interp: ti.i32, grid_type: ti.i32,
                  want_params: ti.i32, want_x: ti.i32, first_level: ti.i32, D: ti.template(), net_lo: ti.i32,
                  H: ti.template()):
    """Accumulate dL/dparams (+=, atomics) and dL/dx (+=, atomics over levels); both must start zeroed.
    dy_t is feature-major like the forward output. Levels below first_level are skipped (the shared-memory
    kernel took their parameter gradient); when want_x they are still visited for dx alone."""
    ti.loop_config(block_dim=256)
    for level, b in ti.ndrange((0 if want_x else first_level, meta.shape[0] - 1), x.shape[0]):
        net = net_ids[b] - net_lo
        if in_chunk(net, params):
            scale, res, size, base, cell, frac = _level_at(x, b, level, meta, param_offset, F, D)
            col = level * F
            params_here = want_params != 0 and level >= first_level
            if interp == NEAREST:
                # Piecewise constant: no input gradient, one entry per feature receives dy.
                if params_here:
                    e = base + _entry(cell, 0, res, size, grid_type, meta, D, H) * F
                    for f in ti.static(range(F)):
                        g = dy_t[col + f, b]
                        if g != 0.0:
                            ti.atomic_add(dparams[net, e + f], g)
            else:
                s, ds, dds = _smooth(frac, interp, D)
                idx, w = _corners(cell, s, res, size, base, grid_type, meta, F, D, H)
                if params_here:
                    for f in ti.static(range(F)):
                        g = dy_t[col + f, b]
                        if g != 0.0:
                            for c in ti.static(range(1 << D)):
                                ti.atomic_add(dparams[net, idx[c] + f], w[c] * g)
                if want_x:
                    g_x = _input_gradient(params, net, idx, s, ds, dy_t, col, b, scale, F, D, False)
                    for k in ti.static(range(D)):
                        ti.atomic_add(dx[b, k], g_x[k])


@ti.func
def _lane_gradient(level, t, x: ti.template(), net_ids: ti.template(), param_offset, meta: ti.template(),
                   dy_t: ti.template(), dparams: ti.template(), F: ti.template(), interp, grid_type,
                   D: ti.template(), net_lo, H: ti.template()):
    """Thread (level, t) of `grid_backward_lanes`: sample t // F, feature t % F."""
    b = t // F
    f = t % F
    g = dy_t[level * F + f, b]
    net = net_ids[b] - net_lo
    if g != 0.0 and in_chunk(net, dparams):
        scale = ti.bit_cast(meta[level, 3], ti.f32)
        res, size = meta[level, 1], meta[level, 2]
        base = param_offset + meta[level, 0] * F + f
        cell, frac = _lattice(x, b, scale, D)
        if interp == NEAREST:
            ti.atomic_add(dparams[net, base + _entry(cell, 0, res, size, grid_type, meta, D, H) * F], g)
        else:
            s, ds, dds = _smooth(frac, interp, D)
            for c in ti.static(range(1 << D)):
                e = base + _entry(cell, c, res, size, grid_type, meta, D, H) * F
                ti.atomic_add(dparams[net, e], _weight(s, c, D) * g)


@fast_kernel
@ti.kernel
def grid_backward_lanes(x: f32_2d, net_ids: i32_1d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d,
                        dparams: f32_2d, F: ti.template(), interp: ti.i32, grid_type: ti.i32, D: ti.template(),
                        net_lo: ti.i32, H: ti.template()):
    """dL/dparams (+=, atomics) of every level, one thread per (level, sample, feature). On CUDA
    `grid_backward_params` runs the same threads for the levels its shared-memory part leaves.

    The parameter gradient is bound by float atomics into L2, which serves them per sector
    request: with a sample's F features on neighbouring threads, each corner's F adds leave
    as one warp request instead of F. The corner hashes are computed F times, which costs little.
    No input gradient here (`grid_backward` does both)."""
    ti.loop_config(block_dim=256)
    for level, t in ti.ndrange(meta.shape[0] - 1, x.shape[0] * F):
        _lane_gradient(level, t, x, net_ids, param_offset, meta, dy_t, dparams, F, interp, grid_type, D, net_lo, H)


@fast_kernel
@ti.kernel
def grid_backward_levels(x: f32_2d, net_ids: i32_1d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d,
                         dparams: f32_2d, F: ti.template(), interp: ti.i32, grid_type: ti.i32, D: ti.template(),
                         net_lo: ti.i32, H: ti.template()):
    """dL/dparams (+=) of every level, one task per level walking all samples in order: for CPUs with no
    more threads than the grid has levels. Levels own disjoint table columns, so no two tasks write one
    word and the adds need no atomics (on the CPU a float atomic is a compare-and-swap loop). No input
    gradient (`grid_backward` does both); the sum over samples has a fixed order."""
    ti.loop_config(block_dim=1)  # one level per task
    for level in range(meta.shape[0] - 1):
        scale = ti.bit_cast(meta[level, 3], ti.f32)
        res, size = meta[level, 1], meta[level, 2]
        base = param_offset + meta[level, 0] * F
        col = level * F
        for b in range(x.shape[0]):
            net = net_ids[b] - net_lo
            if in_chunk(net, dparams):
                cell, frac = _lattice(x, b, scale, D)
                if interp == NEAREST:
                    e = base + _entry(cell, 0, res, size, grid_type, meta, D, H) * F
                    for f in ti.static(range(F)):
                        g = dy_t[col + f, b]
                        if g != 0.0:
                            dparams[net, e + f] = dparams[net, e + f] + g
                else:
                    s, ds, dds = _smooth(frac, interp, D)
                    idx, w = _corners(cell, s, res, size, base, grid_type, meta, F, D, H)
                    for f in ti.static(range(F)):
                        g = dy_t[col + f, b]
                        if g != 0.0:
                            for c in ti.static(range(1 << D)):
                                dparams[net, idx[c] + f] = dparams[net, idx[c] + f] + w[c] * g


@fast_kernel
@ti.kernel
def grid_backward_stochastic(x: f32_2d, net_ids: i32_1d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d,
                             dparams: f32_2d, F: ti.template(), interp: ti.i32, grid_type: ti.i32, D: ti.template(),
                             net_lo: ti.i32, H: ti.template()):
    """dL/dparams (+=, atomics) with tcnn's stochastic interpolation: each (level, sample) sends its whole
    upstream gradient to one corner instead of spreading it N-linearly. The corner is picked by one draw u
    in [0, 1) of tcnn's generator (seed 1337, jumped by sample + level * batch, uint32): along each dim
    the upper vertex where u < s (the interpolation weight), so a corner is picked with its N-linear weight.
    Not for Nearest interpolation (it already has a single corner)."""
    n = ti.cast(x.shape[0], ti.u32)
    for level, b in ti.ndrange(meta.shape[0] - 1, x.shape[0]):
        net = net_ids[b] - net_lo
        if in_chunk(net, dparams):
            scale, res, size, base, cell, frac = _level_at(x, b, level, meta, param_offset, F, D)
            s, ds, dds = _smooth(frac, interp, D)
            u = pcg32.float_after(ti.cast(ti.cast(b, ti.u32) + ti.cast(level, ti.u32) * n, ti.u64))
            corner = 0
            for d in ti.static(range(D)):
                if u < s[d]:
                    corner |= 1 << d
            e = base + _entry(cell, corner, res, size, grid_type, meta, D, H) * F
            for f in ti.static(range(F)):
                g = dy_t[level * F + f, b]
                if g != 0.0:
                    ti.atomic_add(dparams[net, e + f], g)


SHARED_BLOCK = 256
SHARED_FLOATS = 12288   # 48 KB, the static shared-memory limit per block
SHARED_CHUNK = 4096     # samples per block: the flush of a whole level is paid once per this many


def shared_levels(sizes: list[int], n_features: int) -> int:
    """How many leading (coarse) levels fit in one block's shared memory."""
    n = 0
    while n < len(sizes) and sizes[n] * n_features <= SHARED_FLOATS:
        n += 1
    return n


@ti.func
def _shared_level_block(g, n_chunks, x: ti.template(), param_offset, meta: ti.template(), dy_t: ti.template(),
                        dparams: ti.template(), F: ti.template(), interp, grid_type, D: ti.template(),
                        H: ti.template()):
    """Thread g of `grid_backward_shared` (block g // SHARED_BLOCK)."""
    blk = g // SHARED_BLOCK
    tid = g % SHARED_BLOCK
    level = blk // n_chunks
    first = (blk % n_chunks) * SHARED_CHUNK
    sh = ti.simt.block.SharedArray((SHARED_FLOATS,), ti.f32)
    scale = ti.bit_cast(meta[level, 3], ti.f32)
    res, size = meta[level, 1], meta[level, 2]
    n_floats = size * F
    col = level * F
    for j in range((n_floats + SHARED_BLOCK - 1) // SHARED_BLOCK):
        idx = j * SHARED_BLOCK + tid
        if idx < n_floats:
            sh[idx] = 0.0
    ti.simt.block.sync()
    for j in range(SHARED_CHUNK // SHARED_BLOCK):
        b = first + j * SHARED_BLOCK + tid
        if b < x.shape[0]:
            cell, frac = _lattice(x, b, scale, D)
            if interp == NEAREST:
                e = _entry(cell, 0, res, size, grid_type, meta, D, H) * F
                for f in ti.static(range(F)):
                    ti.atomic_add(sh[e + f], dy_t[col + f, b])
            else:
                s, ds, dds = _smooth(frac, interp, D)
                idx = ti.Vector([0] * (1 << D), dt=ti.i32)
                w = ti.Vector([0.0] * (1 << D), dt=ti.f32)
                for c in ti.static(range(1 << D)):
                    idx[c] = _entry(cell, c, res, size, grid_type, meta, D, H) * F
                    w[c] = _weight(s, c, D)
                for f in ti.static(range(F)):
                    gv = dy_t[col + f, b]
                    if gv != 0.0:
                        for c in ti.static(range(1 << D)):
                            ti.atomic_add(sh[idx[c] + f], w[c] * gv)
    ti.simt.block.sync()
    base = param_offset + meta[level, 0] * F
    for j in range((n_floats + SHARED_BLOCK - 1) // SHARED_BLOCK):
        idx = j * SHARED_BLOCK + tid
        if idx < n_floats:
            v = sh[idx]
            if v != 0.0:
                ti.atomic_add(dparams[0, base + idx], v)


@fast_kernel
@ti.kernel
def grid_backward_shared(x: f32_2d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d, dparams: f32_2d,
                         F: ti.template(), interp: ti.i32, grid_type: ti.i32, n_levels: ti.i32, D: ti.template(),
                         H: ti.template()):
    """dL/dparams (+=) of levels [0, n_levels) of a single grid (dparams row 0), CUDA only.

    One block per (level, chunk of SHARED_CHUNK samples): scatter into a zeroed shared copy of the
    level with shared-memory atomics, then add the non-zero entries to global memory.
    """
    n_chunks = (x.shape[0] + SHARED_CHUNK - 1) // SHARED_CHUNK
    ti.loop_config(block_dim=SHARED_BLOCK)
    for g in range(n_levels * n_chunks * SHARED_BLOCK):
        _shared_level_block(g, n_chunks, x, param_offset, meta, dy_t, dparams, F, interp, grid_type, D, H)


@fast_kernel(ir_passes=False)
@ti.kernel
def grid_backward_params(x: f32_2d, net_ids: i32_1d, param_offset: ti.i32, meta: i32_2d, dy_t: f32_2d,
                         dparams: f32_2d, F: ti.template(), interp: ti.i32, grid_type: ti.i32, n_shared: ti.i32,
                         D: ti.template(), net_lo: ti.i32, H: ti.template()):
    """dL/dparams (+=) on CUDA in one launch: levels [0, n_shared) as `grid_backward_shared` (a single
    grid), the rest as `grid_backward_lanes`. One launch instead of two saves a launch's host time per step
    (Taichi's launch path allocates, copies and frees an argument buffer each time; docs/design-notes.md)."""
    n_chunks = (x.shape[0] + SHARED_CHUNK - 1) // SHARED_CHUNK
    ti.loop_config(block_dim=SHARED_BLOCK)
    for g in range(n_shared * n_chunks * SHARED_BLOCK):
        _shared_level_block(g, n_chunks, x, param_offset, meta, dy_t, dparams, F, interp, grid_type, D, H)
    ti.loop_config(block_dim=256)
    for level, t in ti.ndrange((n_shared, meta.shape[0] - 1), x.shape[0] * F):
        _lane_gradient(level, t, x, net_ids, param_offset, meta, dy_t, dparams, F, interp, grid_type, D, net_lo, H)


@ti.kernel
def grid_backward_backward(x: f32_2d, net_ids: i32_1d, params: f32_2d, param_offset: ti.i32, meta: i32_2d,
                           dy: f32_2d, gdx: f32_2d, g_dy: f32_2d, g_params: f32_2d, g_x: f32_2d,
                           n_features: ti.i32, interp: ti.i32, grid_type: ti.i32,
                           want_dy: ti.i32, want_params: ti.i32, want_x: ti.i32, D: ti.template(), net_lo: ti.i32,
                           H: ti.template()):
    """Second order: given gdx = dL/d(dx) where dx = J(x, params)^T dy, accumulate
    dL/ddy (= J gdx), dL/dparams and dL/dx (Hessian term). All outputs must start zeroed.
    The corner loop is dynamic here (rare path; keeps the compiled kernel small)."""
    for level, b in ti.ndrange(meta.shape[0] - 1, x.shape[0]):
        net = net_ids[b] - net_lo
        if interp != NEAREST and in_chunk(net, params):  # nearest lookups: dx == 0, no second-order term
            scale = ti.bit_cast(meta[level, 3], ti.f32)
            res, size = meta[level, 1], meta[level, 2]
            base = param_offset + meta[level, 0] * n_features
            col = level * n_features
            cell, frac = _lattice(x, b, scale, D)
            s, ds, dds = _smooth(frac, interp, D)
            gv = ti.Vector([0.0] * D, dt=ti.f32)
            for k in ti.static(range(D)):
                gv[k] = gdx[b, k]
            gx = ti.Vector([0.0] * D, dt=ti.f32)
            for c in range(1 << D):
                e = base + _entry(cell, c, res, size, grid_type, meta, D, H) * n_features
                wv = ti.Vector([0.0] * D, dt=ti.f32)   # signed per-dimension factor and derivatives
                dwv = ti.Vector([0.0] * D, dt=ti.f32)
                ddwv = ti.Vector([0.0] * D, dt=ti.f32)
                for d in ti.static(range(D)):
                    if (c >> d) & 1:
                        wv[d] = s[d]
                        dwv[d] = ds[d]
                        ddwv[d] = dds[d]
                    else:
                        wv[d] = 1.0 - s[d]
                        dwv[d] = -ds[d]
                        ddwv[d] = -dds[d]
                wd = 0.0  # directional derivative of the corner weight along gdx (in x units)
                for k in ti.static(range(D)):
                    prod = 1.0
                    for d in ti.static(range(D)):
                        if ti.static(d == k):
                            prod *= dwv[d]
                        else:
                            prod *= wv[d]
                    wd += gv[k] * prod
                wd *= scale
                if want_dy:
                    for f in range(n_features):
                        g_dy[b, col + f] = g_dy[b, col + f] + wd * params[net, e + f]
                if want_params:
                    for f in range(n_features):
                        g = dy[b, col + f]
                        if g != 0.0:
                            ti.atomic_add(g_params[net, e + f], g * wd)
                if want_x:
                    vg = 0.0
                    for f in range(n_features):
                        vg += dy[b, col + f] * params[net, e + f]
                    for j in ti.static(range(D)):
                        hj = 0.0
                        for k in ti.static(range(D)):
                            prod = 1.0
                            for d in ti.static(range(D)):
                                if ti.static(d == j and d == k):
                                    prod *= ddwv[d]
                                elif ti.static(d == j or d == k):
                                    prod *= dwv[d]
                                else:
                                    prod *= wv[d]
                            hj += prod * gv[k]
                        gx[j] += vg * hj
            if want_x:
                for j in ti.static(range(D)):
                    ti.atomic_add(g_x[b, j], gx[j] * scale * scale)

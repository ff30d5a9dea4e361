"""Fused MLP-array kernels for CUDA: one launch runs every layer of a tile of samples.

A thread block owns one *tile*: up to TS samples (in network-sorted order) that
share a network. The tile's layer input lives in shared memory feature-major,
`A[feature, sample]`; each layer is a small GEMM where every thread keeps an
R x C block (R samples x C outputs) in registers, so R + C loads feed R * C
multiply-adds. Outputs overwrite the input in place between two barriers, so
activations never leave the chip except when training keeps them for the
backward pass. Weights are read through the L1 cache: a warp touches only two
weight addresses per load (broadcasts), and Taichi 1.7.4's dynamic shared
memory (arrays over 48 KB) fails at run time, so shared memory is kept for the
activations, which need it.

Thread layout in a block of 128: `lane_s = tid % 16` picks samples lane_s + 16 r,
`lane_o = tid // 16` picks outputs lane_o + 8 c. A warp then reads 16
consecutive samples (distinct banks). Row strides are padded by one float so
feature-major stores from coalesced row reads don't collide in one bank.

Backward: a block owns a *chunk* of up to CHUNK sub-tiles of one network. Per
sub-tile, the output deltas and the layer input sit in shared memory; per layer
the block forms the weight gradient (each thread an R x C register block summed
over the samples) and the deltas of the layer below (the forward GEMM with the
transposed matrix). Weight gradients stay in registers across the chunk's
sub-tiles when they fit (widths up to 64), so global memory sees one atomic add
per weight per chunk instead of per sample.

CUDA only: `ti.simt.block.sync()` does not compile on the CPU backend, which
keeps the unfused kernels of `mlp_array.py`.
"""
import os

import taichi as ti

from . import activations as act
from .mlp_array import layer_shapes

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

BLOCK = 128          # threads per block
LANES_S = 16         # sample lanes
LANES_O = BLOCK // LANES_S
MAX_FEATURES = 128   # widest layer input/output the fused path takes
SHARED_FLOATS = 12288  # 48 KB: the static shared-memory limit per block
MAX_GRAD_REGISTERS = 64  # weight-gradient floats a thread may keep across sub-tiles


def round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def features(n_in: int, width: int, n_out: int) -> int:
    return round_up(max(n_in, width, n_out), 16)


def _largest_tile(n_buffers: int, f: int, reserved: int = 0) -> int:
    """Largest multiple of 16 samples whose n_buffers feature-major buffers fit in 48 KB next to `reserved` floats."""
    return min(128, (((SHARED_FLOATS - reserved) // (n_buffers * f) - 1) // LANES_S) * LANES_S)


def grad_registers(n_in: int, width: int, n_out: int, n_layers: int, upto: int | None = None) -> int:
    """Weight-gradient floats one backward thread keeps for layers [0, upto) (all by default)."""
    shapes = layer_shapes(n_in, width, n_out, n_layers)[:upto]
    return sum(((o + LANES_O - 1) // LANES_O) * ((i + LANES_S - 1) // LANES_S) for o, i in shapes)


def geometry(n_in: int, width: int, n_out: int, n_layers: int):
    """(forward tile, forward weights in shared memory?, backward sub-tile, sub-tiles per backward chunk, F).

    With TINN_FUSED_STAGE_WEIGHTS=1 the forward pass stages each layer's weights in shared
    memory when a tile of at least 64 samples still fits beside them; by default they come through L1.
    The TINN_FUSED_* variables are tuning knobs for the A/B scripts in benchmarks/debug/.
    """
    f = features(n_in, width, n_out)
    chunk = 8 if grad_registers(n_in, width, n_out, n_layers) <= MAX_GRAD_REGISTERS else 1
    chunk = int(os.environ.get("TINN_FUSED_CHUNK", chunk))
    # Tile caps (multiples of 16): smaller tiles mean fewer registers and more blocks per SM. Forward
    # tiles of 64 (a 4 x 8 register block) ran 1.33x faster than 128 on an H100 (4.8 vs 6.4 ms).
    fwd_cap = int(os.environ.get("TINN_FUSED_TILE", 64))
    bwd_tile = min(_largest_tile(2, f), int(os.environ.get("TINN_FUSED_BWD_TILE", 128)))
    # Staging weights in shared memory measured slower (training forward 8.1 ms against 6.2 ms through
    # L1, 4096 nets x 64 wide, 2^22 samples): it shrinks the tile. Kept as an option.
    staged = _largest_tile(1, f, f * (f + 1))
    if staged >= 64 and os.environ.get("TINN_FUSED_STAGE_WEIGHTS") == "1":
        return min(staged, fwd_cap), True, bwd_tile, chunk, f
    return min(_largest_tile(1, f), fwd_cap), False, bwd_tile, chunk, f


def supported(n_in: int, width: int, n_out: int) -> bool:
    return max(n_in, width, n_out) <= MAX_FEATURES


@ti.func
def layer_offset(l: ti.template(), n_in: ti.template(), width: ti.template()):
    return 0 if ti.static(l == 0) else n_in * width + (l - 1) * width * width


@ti.func
def tile_gemm(sh: ti.template(), a_base, params: ti.template(), net, offset, k_count: ti.template(),
              n_cols: ti.template(), transposed: ti.template(), lane_s, lane_o,
              R: ti.template(), C: ti.template(), TSP: ti.template(), w_base: ti.template() = -1,
              WP: ti.template() = 0):
    """acc[r, c] = sum_k A[k, lane_s + 16 r] * M[k, lane_o + 8 c].

    A is feature-major in shared memory. M is the layer's weight matrix W (fan_out, fan_in)
    read from global memory: M = W^T (forward, k = input) or, with `transposed`, M = W
    (backward, k = output). Columns past n_cols are clamped to a valid address and ignored.
    With w_base >= 0 the forward matrix is read from shared memory instead, row-major W[o, i]
    with row stride WP.
    """
    acc = ti.Matrix.zero(ti.f32, R, C)
    for k in range(k_count):
        a = ti.Vector([sh[a_base + k * TSP + r * LANES_S + lane_s] for r in ti.static(range(R))], dt=ti.f32)
        m = ti.Vector.zero(ti.f32, C)
        for c in ti.static(range(C)):
            j = c * LANES_O + lane_o
            if ti.static(n_cols % LANES_O != 0):
                j = ti.min(j, n_cols - 1)
            if ti.static(w_base >= 0):
                m[c] = sh[w_base + j * WP + k]
            elif ti.static(transposed):
                m[c] = params[net, offset + k * n_cols + j]
            else:
                m[c] = params[net, offset + j * k_count + k]
        for r, c in ti.static(ti.ndrange(R, C)):
            acc[r, c] += a[r] * m[c]
    return acc


@ti.func
def load_rows(sh: ti.template(), base, x: ti.template(), order: ti.template(), start, count, tid,
              n: ti.template(), TS: ti.template(), TSP: ti.template()):
    """Tile rows x[order[start + s], 0:n] into sh[base + k * TSP + s]; zeros past `count`."""
    for j in range((TS * n + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        s = idx // n
        k = idx % n
        if s < TS:
            v = 0.0
            if s < count:
                v = x[order[start + s], k]
            sh[base + k * TSP + s] = v


@ti.func
def load_features(sh: ti.template(), base, buf: ti.template(), l, start, count, tid,
                  n: ti.template(), TS: ti.template(), TSP: ti.template()):
    """Feature-major scratch buf[l, 0:n, start + s] into sh[base + k * TSP + s]; zeros past `count`."""
    for j in range((TS * n + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        k = idx // TS
        s = idx % TS
        if k < n:
            v = 0.0
            if s < count:
                v = buf[l, k, start + s]
            sh[base + k * TSP + s] = v


@ti.func
def load_weights(sh: ti.template(), base, params: ti.template(), net, offset, tid,
                 fan_out: ti.template(), fan_in: ti.template(), WP: ti.template()):
    """Weight matrix (fan_out, fan_in) into shared memory rows of stride WP (coalesced, conflict-free)."""
    for j in range((fan_out * fan_in + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        if idx < fan_out * fan_in:
            sh[base + (idx // fan_in) * WP + idx % fan_in] = params[net, offset + idx]


@ti.func
def store_block(sh: ti.template(), base, acc: ti.template(), lane_s, lane_o, n_rows: ti.template(),
                R: ti.template(), C: ti.template(), TSP: ti.template()):
    """Register block back to feature-major shared memory (rows < n_rows)."""
    for r, c in ti.static(ti.ndrange(R, C)):
        o = c * LANES_O + lane_o
        if o < n_rows:
            sh[base + o * TSP + r * LANES_S + lane_s] = acc[r, c]


@ti.func
def write_rows(sh: ti.template(), base, y: ti.template(), order: ti.template(), start, count, tid,
               n: ti.template(), TS: ti.template(), TSP: ti.template()):
    """Feature-major tile back to caller rows y[order[start + s], 0:n] (coalesced along the row)."""
    for j in range((TS * n + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        s = idx // n
        k = idx % n
        if s < count:
            y[order[start + s], k] = sh[base + k * TSP + s]



@ti.kernel
def forward(
    x: f32_2d, order: i32_1d, tile_net: i32_1d, tile_start: i32_1d, tile_count: i32_1d, params: f32_2d,
    acts: f32_3d, out: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), keep_all: ti.template(),
    TS: ti.template(), staged: ti.template(), F: ti.template(),
):
    """out = MLP(x) per sample; keep_all stores every hidden activation in acts[l, feature, sorted position]."""
    TSP = ti.static(TS + 1)
    R = ti.static(TS // LANES_S)
    A = ti.static(0)
    WP = ti.static(F + 1)
    WB = ti.static(F * TSP if staged else -1)  # staged weights follow the activations
    shapes = ti.static(layer_shapes(n_in, width, n_out, n_layers))
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((F * TSP + (F * WP if staged else 0),), ti.f32)
        count = tile_count[t]
        if count > 0:  # uniform per block: padding tiles skip every barrier together
            net = tile_net[t]
            start = tile_start[t]
            load_rows(sh, A, x, order, start, count, tid, n_in, TS, TSP)
            if ti.static(staged):
                load_weights(sh, WB, params, net, 0, tid, shapes[0][0], shapes[0][1], WP)
            ti.simt.block.sync()
            for l in ti.static(range(n_layers)):
                fan_in = ti.static(n_in if l == 0 else width)
                fan_out = ti.static(n_out if l == n_layers - 1 else width)
                C = ti.static((fan_out + LANES_O - 1) // LANES_O)
                acc = tile_gemm(sh, A, params, net, layer_offset(l, n_in, width), fan_in, fan_out, False,
                                lane_s, lane_o, R, C, TSP, WB, WP)
                for r, c in ti.static(ti.ndrange(R, C)):
                    acc[r, c] = act.apply(acc[r, c], hidden_act if ti.static(l < n_layers - 1) else output_act)
                ti.simt.block.sync()
                store_block(sh, A, acc, lane_s, lane_o, fan_out, R, C, TSP)
                if ti.static(keep_all and l < n_layers - 1):
                    for r, c in ti.static(ti.ndrange(R, C)):
                        s = r * LANES_S + lane_s
                        if s < count:
                            acts[l, c * LANES_O + lane_o, start + s] = acc[r, c]
                if ti.static(staged and l < n_layers - 1):
                    load_weights(sh, WB, params, net, layer_offset(l + 1, n_in, width), tid,
                                 shapes[l + 1][0], shapes[l + 1][1], WP)
                ti.simt.block.sync()
            write_rows(sh, A, out, order, start, count, tid, n_out, TS, TSP)
            ti.simt.block.sync()


@ti.func
def weight_gradient_block(sh: ti.template(), g_base, h_base, count, lane_i, lane_o,
                          RW: ti.template(), CW: ti.template(), TSP: ti.template()):
    """acc[r, c] = sum_s G[lane_o + 8 r, s] * H[lane_i + 16 c, s] over the sub-tile's samples."""
    acc = ti.Matrix.zero(ti.f32, RW, CW)
    for s in range(count):
        d = ti.Vector([sh[g_base + (r * LANES_O + lane_o) * TSP + s] for r in ti.static(range(RW))], dt=ti.f32)
        h = ti.Vector([sh[h_base + (c * LANES_S + lane_i) * TSP + s] for c in ti.static(range(CW))], dt=ti.f32)
        for r, c in ti.static(ti.ndrange(RW, CW)):
            acc[r, c] += d[r] * h[c]
    return acc


@ti.func
def add_weight_gradient(dparams: ti.template(), net, offset, v, o, i, fan_out: ti.template(), fan_in: ti.template()):
    if o < fan_out and i < fan_in:
        ti.atomic_add(dparams[net, offset + o * fan_in + i], v)


@ti.kernel
def backward(
    dy: f32_2d, x: f32_2d, order: i32_1d, tile_net: i32_1d, tile_start: i32_1d, tile_count: i32_1d,
    params: f32_2d, acts: f32_3d, out: f32_2d, dparams: f32_2d, dx: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), want_dx: ti.template(),
    TS: ti.template(), CHUNK: ti.template(), F: ti.template(),
):
    """dparams += dLoss/dW; dx = dLoss/dx when want_dx. Tiles here are chunks of up to CHUNK * TS samples."""
    TSP = ti.static(TS + 1)
    R = ti.static(TS // LANES_S)
    G = ti.static(0)              # deltas of the current layer's outputs
    H = ti.static(F * TSP)        # the current layer's input
    last = ti.static(n_layers - 1)
    shapes = ti.static(layer_shapes(n_in, width, n_out, n_layers))
    keep = ti.static(CHUNK > 1)   # weight gradients summed in registers over the chunk
    n_keep = ti.static(grad_registers(n_in, width, n_out, n_layers) if CHUNK > 1 else 1)
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((2 * F * TSP,), ti.f32)
        chunk_count = tile_count[t]
        if chunk_count > 0:
            net = tile_net[t]
            kept = ti.Vector.zero(ti.f32, n_keep)
            for sub in range((chunk_count + TS - 1) // TS):
                start = tile_start[t] + sub * TS
                count = ti.min(TS, chunk_count - sub * TS)
                # Output deltas: dy times the output activation's derivative (taken from the output).
                for j in range((TS * n_out + BLOCK - 1) // BLOCK):
                    idx = j * BLOCK + tid
                    s = idx // n_out
                    o = idx % n_out
                    if s < TS:
                        v = 0.0
                        if s < count:
                            b = order[start + s]
                            v = dy[b, o] * act.derivative(0.0, out[b, o], output_act)
                        sh[G + o * TSP + s] = v
                if ti.static(last == 0):
                    load_rows(sh, H, x, order, start, count, tid, n_in, TS, TSP)
                else:
                    load_features(sh, H, acts, last - 1, start, count, tid, width, TS, TSP)
                ti.simt.block.sync()
                for q in ti.static(range(n_layers)):
                    l = ti.static(last - q)
                    fan_out, fan_in = ti.static(shapes[l])
                    offset = layer_offset(l, n_in, width)
                    # Weight gradient of layer l: threads own (8-strided rows, 16-strided columns).
                    RW = ti.static((fan_out + LANES_O - 1) // LANES_O)
                    CW = ti.static((fan_in + LANES_S - 1) // LANES_S)
                    base = ti.static(grad_registers(n_in, width, n_out, n_layers, l))
                    gw = weight_gradient_block(sh, G, H, count, lane_s, lane_o, RW, CW, TSP)
                    for r, c in ti.static(ti.ndrange(RW, CW)):
                        if ti.static(keep):
                            kept[base + r * CW + c] += gw[r, c]
                        else:
                            add_weight_gradient(dparams, net, offset, gw[r, c], r * LANES_O + lane_o,
                                                c * LANES_S + lane_s, fan_out, fan_in)
                    if ti.static(l > 0 or want_dx):
                        # Deltas one layer down: (W^T G)[i, s], times the hidden activation's derivative.
                        C = ti.static((fan_in + LANES_O - 1) // LANES_O)
                        acc = tile_gemm(sh, G, params, net, offset, fan_out, fan_in, True, lane_s, lane_o, R, C, TSP)
                        if ti.static(l > 0):
                            for r, c in ti.static(ti.ndrange(R, C)):
                                i = c * LANES_O + lane_o
                                if i < fan_in:
                                    y = sh[H + i * TSP + r * LANES_S + lane_s]
                                    acc[r, c] *= act.derivative(0.0, y, hidden_act)
                        ti.simt.block.sync()
                        store_block(sh, G, acc, lane_s, lane_o, fan_in, R, C, TSP)
                        if ti.static(l == 1):
                            load_rows(sh, H, x, order, start, count, tid, n_in, TS, TSP)
                        elif ti.static(l > 1):
                            load_features(sh, H, acts, l - 2, start, count, tid, width, TS, TSP)
                        ti.simt.block.sync()
                if ti.static(want_dx):
                    write_rows(sh, G, dx, order, start, count, tid, n_in, TS, TSP)
                ti.simt.block.sync()
            if ti.static(keep):
                for l in ti.static(range(n_layers)):
                    fan_out, fan_in = ti.static(shapes[l])
                    RW = ti.static((fan_out + LANES_O - 1) // LANES_O)
                    CW = ti.static((fan_in + LANES_S - 1) // LANES_S)
                    base = ti.static(grad_registers(n_in, width, n_out, n_layers, l))
                    for r, c in ti.static(ti.ndrange(RW, CW)):
                        add_weight_gradient(dparams, net, layer_offset(l, n_in, width), kept[base + r * CW + c],
                                            r * LANES_O + lane_o, c * LANES_S + lane_s, fan_out, fan_in)

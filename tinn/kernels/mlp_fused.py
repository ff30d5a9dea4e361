"""Fused MLP-array kernels for CUDA: one launch runs every layer of a tile of samples.

A thread block owns one *tile*: up to TS samples (in network-sorted order) that
share a network. The tile's layer input lives in shared memory feature-major,
`A[feature, sample]`, next to the current layer's weight matrix; each layer is a
small GEMM where every thread keeps an R x C block (R samples x C outputs) in
registers, so R + C shared loads feed R * C multiply-adds. Outputs overwrite
the input in place between two barriers, so activations never leave the chip
except when training keeps them for the backward pass.

Thread layout in a block of 128: `lane_s = tid % 16` picks samples lane_s + 16 r,
`lane_o = tid // 16` picks outputs lane_o + 8 c. A warp then reads 16
consecutive samples (distinct banks) and two weight addresses (broadcasts).
Row strides are padded by one float so feature-major stores from coalesced
global reads don't collide in one bank.

Backward (one block per tile as well): the tile's output deltas, layer input
and weights sit in shared memory; per layer the block forms the weight
gradient (an R x C register block per thread, summed over the tile's samples,
then one atomic add per weight per tile) and the deltas of the layer below
(the same GEMM as the forward pass with the untransposed matrix).

CUDA only: `ti.simt.block.sync()` does not compile on the CPU backend, which
keeps the unfused kernels of `mlp_array.py`.
"""
import taichi as ti

from . import activations as act

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

BLOCK = 128          # threads per block
LANES_S = 16         # sample lanes (forward / delta GEMM)
LANES_O = BLOCK // LANES_S
MAX_FEATURES = 128   # widest layer input/output the fused path takes


def round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def tile_samples(width: int) -> int:
    """Samples per tile: 128, or 64 at width 128 to keep the register block and shared memory in bounds."""
    return 64 if width > 64 else 128


def geometry(n_in: int, width: int, n_out: int):
    """(TS, F): tile samples and the padded feature count every shared buffer is sized for."""
    return tile_samples(width), round_up(max(n_in, width, n_out), 16)


def supported(n_in: int, width: int, n_out: int) -> bool:
    return max(n_in, width, n_out) <= MAX_FEATURES


@ti.func
def layer_offset(l: ti.template(), n_in: ti.template(), width: ti.template()):
    return 0 if ti.static(l == 0) else n_in * width + (l - 1) * width * width


@ti.func
def tile_gemm(sh: ti.template(), a_base, m_base, k_count, lane_s, lane_o,
              R: ti.template(), C: ti.template(), TSP: ti.template(), FP: ti.template()):
    """acc[r, c] = sum_k A[k, lane_s + 16 r] * M[k, lane_o + 8 c], A and M feature-major in shared memory."""
    acc = ti.Matrix.zero(ti.f32, R, C)
    for k in range(k_count):
        a = ti.Vector([sh[a_base + k * TSP + r * LANES_S + lane_s] for r in ti.static(range(R))], dt=ti.f32)
        m = ti.Vector([sh[m_base + k * FP + c * LANES_O + lane_o] for c in ti.static(range(C))], dt=ti.f32)
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
                 fan_out: ti.template(), fan_in: ti.template(), FP: ti.template(), transposed: ti.template()):
    """Weight matrix (fan_out, fan_in) into shared memory: W^T[i, o] (forward) or W[o, i] (backward)."""
    for j in range((fan_out * fan_in + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        if idx < fan_out * fan_in:
            o = idx // fan_in
            i = idx % fan_in
            v = params[net, offset + idx]
            if ti.static(transposed):
                sh[base + i * FP + o] = v
            else:
                sh[base + o * FP + i] = v


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
    TS: ti.template(), F: ti.template(),
):
    """out = MLP(x) per sample; keep_all stores every hidden activation in acts[l, feature, sorted position]."""
    TSP = ti.static(TS + 1)
    FP = ti.static(F + 1)
    R = ti.static(TS // LANES_S)
    A = ti.static(0)
    WB = ti.static(F * TSP)
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((F * TSP + F * FP,), ti.f32)
        count = tile_count[t]
        if count > 0:  # uniform per block: padding tiles skip every barrier together
            net = tile_net[t]
            start = tile_start[t]
            load_rows(sh, A, x, order, start, count, tid, n_in, TS, TSP)
            load_weights(sh, WB, params, net, layer_offset(0, n_in, width), tid,
                         width if ti.static(n_layers > 1) else n_out, n_in, FP, True)
            ti.simt.block.sync()
            for l in ti.static(range(n_layers)):
                fan_in = ti.static(n_in if l == 0 else width)
                fan_out = ti.static(n_out if l == n_layers - 1 else width)
                C = ti.static((fan_out + LANES_O - 1) // LANES_O)
                acc = tile_gemm(sh, A, WB, fan_in, lane_s, lane_o, R, C, TSP, FP)
                for r, c in ti.static(ti.ndrange(R, C)):
                    acc[r, c] = act.apply(acc[r, c], hidden_act if ti.static(l < n_layers - 1) else output_act)
                ti.simt.block.sync()
                store_block(sh, A, acc, lane_s, lane_o, fan_out, R, C, TSP)
                if ti.static(l < n_layers - 1):
                    if ti.static(keep_all):
                        for r, c in ti.static(ti.ndrange(R, C)):
                            s = r * LANES_S + lane_s
                            if s < count:
                                acts[l, c * LANES_O + lane_o, start + s] = acc[r, c]
                    next_out = ti.static(n_out if l + 1 == n_layers - 1 else width)
                    load_weights(sh, WB, params, net, layer_offset(l + 1, n_in, width), tid,
                                 next_out, width, FP, True)
                ti.simt.block.sync()
            write_rows(sh, A, out, order, start, count, tid, n_out, TS, TSP)
            ti.simt.block.sync()


@ti.func
def weight_gradient_block(sh: ti.template(), g_base, h_base, count, lane_i, lane_o,
                          RW: ti.template(), CW: ti.template(), TSP: ti.template()):
    """acc[r, c] = sum_s G[lane_o + 8 r, s] * H[lane_i + 16 c, s] over the tile's samples."""
    acc = ti.Matrix.zero(ti.f32, RW, CW)
    for s in range(count):
        d = ti.Vector([sh[g_base + (r * LANES_O + lane_o) * TSP + s] for r in ti.static(range(RW))], dt=ti.f32)
        h = ti.Vector([sh[h_base + (c * LANES_S + lane_i) * TSP + s] for c in ti.static(range(CW))], dt=ti.f32)
        for r, c in ti.static(ti.ndrange(RW, CW)):
            acc[r, c] += d[r] * h[c]
    return acc


@ti.kernel
def backward(
    dy: f32_2d, x: f32_2d, order: i32_1d, tile_net: i32_1d, tile_start: i32_1d, tile_count: i32_1d,
    params: f32_2d, acts: f32_3d, out: f32_2d, dparams: f32_2d, dx: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), want_dx: ti.template(),
    TS: ti.template(), F: ti.template(),
):
    """dparams += dLoss/dW (one atomic add per weight per tile); dx = dLoss/dx when want_dx."""
    TSP = ti.static(TS + 1)
    FP = ti.static(F + 1)
    R = ti.static(TS // LANES_S)
    G = ti.static(0)              # deltas of the current layer's outputs
    H = ti.static(F * TSP)        # the current layer's input
    WB = ti.static(2 * F * TSP)   # the current layer's weights, untransposed
    last = ti.static(n_layers - 1)
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((2 * F * TSP + F * FP,), ti.f32)
        count = tile_count[t]
        if count > 0:
            net = tile_net[t]
            start = tile_start[t]
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
            load_weights(sh, WB, params, net, layer_offset(last, n_in, width), tid,
                         n_out, n_in if ti.static(last == 0) else width, FP, False)
            ti.simt.block.sync()
            for q in ti.static(range(n_layers)):
                l = ti.static(last - q)
                fan_in = ti.static(n_in if l == 0 else width)
                fan_out = ti.static(n_out if l == last else width)
                # Weight gradient of layer l: threads own (8-strided rows, 16-strided columns).
                RW = ti.static((fan_out + LANES_O - 1) // LANES_O)
                CW = ti.static((fan_in + LANES_S - 1) // LANES_S)
                gw = weight_gradient_block(sh, G, H, count, lane_s, lane_o, RW, CW, TSP)
                offset = layer_offset(l, n_in, width)
                for r, c in ti.static(ti.ndrange(RW, CW)):
                    o = r * LANES_O + lane_o
                    i = c * LANES_S + lane_s
                    if o < fan_out and i < fan_in:
                        ti.atomic_add(dparams[net, offset + o * fan_in + i], gw[r, c])
                if ti.static(l > 0 or want_dx):
                    # Deltas one layer down: (W^T G)[i, s], times the hidden activation's derivative.
                    C = ti.static((fan_in + LANES_O - 1) // LANES_O)
                    acc = tile_gemm(sh, G, WB, fan_out, lane_s, lane_o, R, C, TSP, FP)
                    if ti.static(l > 0):
                        for r, c in ti.static(ti.ndrange(R, C)):
                            i = c * LANES_O + lane_o
                            if i < fan_in:
                                y = sh[H + i * TSP + r * LANES_S + lane_s]
                                acc[r, c] *= act.derivative(0.0, y, hidden_act)
                    ti.simt.block.sync()
                    store_block(sh, G, acc, lane_s, lane_o, fan_in, R, C, TSP)
                    if ti.static(l > 0):
                        if ti.static(l - 1 == 0):
                            load_rows(sh, H, x, order, start, count, tid, n_in, TS, TSP)
                        else:
                            load_features(sh, H, acts, l - 2, start, count, tid, width, TS, TSP)
                        load_weights(sh, WB, params, net, layer_offset(l - 1, n_in, width), tid,
                                     width, n_in if ti.static(l - 1 == 0) else width, FP, False)
                    ti.simt.block.sync()
            if ti.static(want_dx):
                write_rows(sh, G, dx, order, start, count, tid, n_in, TS, TSP)
            ti.simt.block.sync()

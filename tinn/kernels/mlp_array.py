"""Forward and hand-written backward of an array of identically shaped MLPs.

Layout: `params[net, :]` holds the network's weight matrices back to back,
layer l as a row-major (out_l, in_l) block (tcnn MLPs have no biases). Layer l
reads `n_in` inputs when l == 0 and `width` otherwise, and writes `width`
outputs except the last, which writes `n_out`.

Samples are visited in `order` (samples sorted by network id), so neighbouring
threads read the same weights; each sample still reads/writes its own row, so
the caller's order is kept on output.

Weight gradients are reduced per tile (a run of at most `tile` samples that share
a network) before one atomic add per weight, instead of one atomic per
(sample, weight).
"""
import taichi as ti

from . import activations as act

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.func
def layer_shape(l, n_layers, n_in, width, n_out):
    """(fan_in, fan_out, offset into params) of weight matrix l."""
    fan_in = n_in if l == 0 else width
    fan_out = n_out if l == n_layers - 1 else width
    offset = 0 if l == 0 else n_in * width + (l - 1) * width * width
    return fan_in, fan_out, offset


@ti.kernel
def forward(
    x: f32_2d, net_ids: i32_1d, order: i32_1d, params: f32_2d,
    acts: f32_3d, pre: f32_3d, out: f32_2d,
    n_layers: ti.i32, width: ti.i32,
    hidden_act: ti.template(), output_act: ti.template(),
    keep_all: ti.template(), keep_pre: ti.template(),
):
    """keep_all: acts[l] keeps every layer's output (training); else two ping-pong slots (inference)."""
    n_in = x.shape[1]
    n_out = out.shape[1]
    for s in range(order.shape[0]):
        b = order[s]
        net = net_ids[b]
        for l in range(n_layers):
            fan_in, fan_out, offset = layer_shape(l, n_layers, n_in, width, n_out)
            src = l - 1 if ti.static(keep_all) else (l + 1) % 2
            dst = l if ti.static(keep_all) else l % 2
            for o in range(fan_out):
                z = 0.0
                row = offset + o * fan_in
                if l == 0:  # explicit branches: a ternary would read both buffers
                    for i in range(fan_in):
                        z += params[net, row + i] * x[b, i]
                else:
                    for i in range(fan_in):
                        z += params[net, row + i] * acts[src, b, i]
                y = 0.0
                if l == n_layers - 1:
                    y = act.apply(z, output_act)
                    out[b, o] = y
                else:
                    y = act.apply(z, hidden_act)
                    acts[dst, b, o] = y
                if ti.static(keep_pre):
                    pre[l, b, o] = z


COLS = 8  # columns one thread accumulates in registers


@ti.kernel
def backward_deltas(
    dy: f32_2d, net_ids: i32_1d, order: i32_1d, params: f32_2d,
    acts: f32_3d, pre: f32_3d, out: f32_2d, deltas: f32_3d,
    dx: f32_2d, n_in: ti.i32, n_layers: ti.i32, width: ti.i32,
    hidden_act: ti.template(), output_act: ti.template(), keep_pre: ti.template(), want_dx: ti.template(),
):
    """deltas[l, b, o] = dLoss/dz of layer l's output o; dx = dLoss/dinput when want_dx."""
    n_out = dy.shape[1]
    for s in range(order.shape[0]):
        b = order[s]
        net = net_ids[b]
        last = n_layers - 1
        for o in range(n_out):
            z = 0.0
            if ti.static(keep_pre):
                z = pre[last, b, o]
            deltas[last, b, o] = dy[b, o] * act.derivative(z, out[b, o], output_act)
        for r in range(n_layers - 1):
            l = n_layers - 2 - r  # hidden layer whose output feeds layer l + 1
            _, fan_out_next, offset_next = layer_shape(l + 1, n_layers, n_in, width, n_out)
            for i in range(width):
                g = 0.0
                for o in range(fan_out_next):
                    g += params[net, offset_next + o * width + i] * deltas[l + 1, b, o]
                z = 0.0
                if ti.static(keep_pre):
                    z = pre[l, b, i]
                deltas[l, b, i] = g * act.derivative(z, acts[l, b, i], hidden_act)
        if ti.static(want_dx):
            fan_out0 = n_out if n_layers == 1 else width
            for i in range(n_in):
                g = 0.0
                for o in range(fan_out0):
                    g += params[net, o * n_in + i] * deltas[0, b, o]
                dx[b, i] = g


@ti.func
def _accumulate_block(src: ti.template(), layer: ti.template(), order: ti.template(), deltas: ti.template(),
                      l, o, t0, t1, i0, n_cols: ti.template()):
    """Sum over samples s in [t0, t1) of deltas[l, b, o] * src[b, i0:i0+n_cols] (registers only)."""
    acc = ti.Vector.zero(ti.f32, n_cols)
    for s in range(t0, t1):
        b = order[s]
        d = deltas[l, b, o]
        for k in ti.static(range(n_cols)):
            if ti.static(layer):
                acc[k] += d * src[l - 1, b, i0 + k]
            else:
                acc[k] += d * src[b, i0 + k]
    return acc


@ti.kernel
def tile_weight_gradient(
    src: ti.types.ndarray(dtype=ti.f32), from_acts: ti.template(), order: i32_1d,
    tile_start: i32_1d, tile_end: i32_1d, deltas: f32_3d, partial: f32_2d,
    l: ti.i32, fan_in: ti.i32, fan_out: ti.i32, offset: ti.i32,
):
    """partial[t, W_l[o, i]] = sum over tile t's samples of deltas[l, b, o] * input_l[b, i].

    input_l is `src` = x (layer 0) or acts[l - 1]. One thread owns (tile, output
    row, block of COLS inputs) and keeps its sums in registers: no atomics, and
    each weight is written once per tile. Full blocks take a branch-free path.
    """
    n_blocks = (fan_in + COLS - 1) // COLS
    for t, o, blk in ti.ndrange(tile_start.shape[0], fan_out, n_blocks):
        i0 = blk * COLS
        row = offset + o * fan_in + i0
        if i0 + COLS <= fan_in:
            acc = _accumulate_block(src, from_acts, order, deltas, l, o, tile_start[t], tile_end[t], i0, COLS)
            for k in ti.static(range(COLS)):
                partial[t, row + k] = acc[k]
        else:
            for k in range(fan_in - i0):
                acc = _accumulate_block(src, from_acts, order, deltas, l, o, tile_start[t], tile_end[t], i0 + k, 1)
                partial[t, row + k] = acc[0]


@ti.kernel
def reduce_tiles(partial: f32_2d, tile_net: i32_1d, grad: f32_2d):
    """grad[net] = sum of the partial gradients of the net's tiles."""
    for t, k in partial:
        ti.atomic_add(grad[tile_net[t], k], partial[t, k])

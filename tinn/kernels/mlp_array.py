"""Forward and hand-written backward of an array of identically shaped MLPs.

Layout: `params[net, :]` holds the network's weight matrices back to back,
layer l as a row-major (fan_out, fan_in) block (tcnn MLPs have no biases).
Layer 0 reads N_IN inputs, hidden layers WIDTH, the last layer writes N_OUT.
Shapes are compile-time constants, so each thread keeps the current layer's
input vector in registers (statically indexed) while it loops over outputs.

Samples are visited in sorted order: position `s` is the s-th sample after
grouping by network id, `order[s]` its index in the caller's batch. Neighbouring
threads then share a network, so weight reads are broadcasts. Scratch buffers
(activations, pre-activations, deltas) are feature-major, `buf[layer, feature, s]`,
so that a warp's reads and writes are contiguous; inputs, outputs and their
gradients stay in the caller's row order.
"""
from typing import NamedTuple

from ..backend import ti

from .. import chunks, runtime
from . import activations as act
from .deterministic import reduce_tiles_in_order
from .launch import fast_kernel
from .rows import in_chunk

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

ROWS, COLS = 4, 8  # weight-gradient block one thread accumulates in registers


class MLPShape(NamedTuple):
    """The compile-time shape of an MLP array, as every MLP kernel takes it."""
    n_in: int
    width: int
    n_out: int
    n_layers: int       # weight matrices
    hidden_act: int     # activation codes (tinn/activations.py)
    output_act: int


def layer_shapes(n_in: int, width: int, n_out: int, n_layers: int) -> list[tuple[int, int]]:
    """(fan_out, fan_in) of each weight matrix, in parameter-row order."""
    dims = [n_in] + [width] * (n_layers - 1) + [n_out]
    return [(dims[l + 1], dims[l]) for l in range(n_layers)]


def computed_params(shape: MLPShape) -> int:
    """Parameters per network that the kernels compute with: a parameter row may be longer (tcnn's padded
    output rows trail it), and those trailing entries get a zero gradient."""
    return sum(o * i for o, i in layer_shapes(shape.n_in, shape.width, shape.n_out, shape.n_layers))


@ti.func
def layer_offset(l, n_in: ti.template(), width: ti.template()):
    """Offset of weight matrix l inside a network's parameter row."""
    return 0 if l == 0 else n_in * width + (l - 1) * width * width


@ti.func
def dot_row(params: ti.template(), net, row, h: ti.template(), n: ti.template()):
    z = 0.0
    for i in ti.static(range(n)):
        z += params[net, row + i] * h[i]
    return z


@ti.func
def load_column(buf: ti.template(), l, s, n: ti.template()):
    """Feature vector buf[l, 0:n, s] into registers."""
    return ti.Vector([buf[l, i, s] for i in ti.static(range(n))], dt=ti.f32)


@fast_kernel
@ti.kernel
def forward(
    x: f32_2d, net_ids: i32_1d, order: i32_1d, params: f32_2d,
    acts: f32_3d, pre: f32_3d, out: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), keep_all: ti.template(), keep_pre: ti.template(),
    net_lo: ti.i32,
):
    """keep_all: acts[l] keeps every hidden layer's output (training); else two ping-pong slots (inference)."""
    for s in range(order.shape[0]):
        b = order[s]
        net = net_ids[b] - net_lo
        if in_chunk(net, params):
            h_in = ti.Vector([x[b, i] for i in ti.static(range(n_in))], dt=ti.f32)
            if ti.static(n_layers == 1):
                for o in range(n_out):
                    z = dot_row(params, net, o * n_in, h_in, n_in)
                    out[b, o] = act.apply(z, output_act)
                    if ti.static(keep_pre):
                        pre[0, o, s] = z
            else:
                for o in range(width):
                    z = dot_row(params, net, o * n_in, h_in, n_in)
                    acts[0, o, s] = act.apply(z, hidden_act)
                    if ti.static(keep_pre):
                        pre[0, o, s] = z
                for l in range(1, n_layers - 1):
                    src = l - 1 if ti.static(keep_all) else (l - 1) % 2
                    dst = l if ti.static(keep_all) else l % 2
                    h = load_column(acts, src, s, width)
                    offset = layer_offset(l, n_in, width)
                    for o in range(width):
                        z = dot_row(params, net, offset + o * width, h, width)
                        acts[dst, o, s] = act.apply(z, hidden_act)
                        if ti.static(keep_pre):
                            pre[l, o, s] = z
                last = n_layers - 1
                h = load_column(acts, last - 1 if ti.static(keep_all) else (last - 1) % 2, s, width)
                offset = layer_offset(last, n_in, width)
                for o in range(n_out):
                    z = dot_row(params, net, offset + o * width, h, width)
                    out[b, o] = act.apply(z, output_act)
                    if ti.static(keep_pre):
                        pre[last, o, s] = z


@ti.func
def transpose_dot(params: ti.template(), net, offset, i, fan_in: ti.template(), g: ti.template(),
                  fan_out: ti.template()):
    """(W^T g)[i] for the (fan_out, fan_in) matrix at `offset`."""
    v = 0.0
    for o in ti.static(range(fan_out)):
        v += params[net, offset + o * fan_in + i] * g[o]
    return v


@fast_kernel
@ti.kernel
def backward_deltas(
    dy: f32_2d, net_ids: i32_1d, order: i32_1d, params: f32_2d,
    acts: f32_3d, pre: f32_3d, out: f32_2d, deltas: f32_3d, dout: f32_3d, dx: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), keep_pre: ti.template(), want_dx: ti.template(),
    net_lo: ti.i32,
):
    """deltas[l, o, s] = dLoss/dz of hidden layer l's output o, dout[0, o, s] that of the network output;
    dx = dLoss/dinput when want_dx. (The output's deltas have a buffer of their own, n_out rows: in one
    (layers, max(width, n_out), batch) buffer their unused rows cost as much as a layer of activations.)"""
    last = n_layers - 1
    for s in range(order.shape[0]):
        b = order[s]
        net = net_ids[b] - net_lo
        if in_chunk(net, params):
            g_out = ti.Vector.zero(ti.f32, n_out)
            for o in ti.static(range(n_out)):
                z = 0.0
                if ti.static(keep_pre):
                    z = pre[last, o, s]
                g_out[o] = dy[b, o] * act.derivative(z, out[b, o], output_act)
                dout[0, o, s] = g_out[o]
            if ti.static(n_layers > 1):
                offset = layer_offset(last, n_in, width)
                for i in range(width):
                    z = 0.0
                    if ti.static(keep_pre):
                        z = pre[last - 1, i, s]
                    v = transpose_dot(params, net, offset, i, width, g_out, n_out)
                    deltas[last - 1, i, s] = v * act.derivative(z, acts[last - 1, i, s], hidden_act)
                for r in range(n_layers - 2):
                    l = n_layers - 3 - r  # hidden layer whose output feeds layer l + 1
                    g = load_column(deltas, l + 1, s, width)
                    offset_next = layer_offset(l + 1, n_in, width)
                    for i in range(width):
                        z = 0.0
                        if ti.static(keep_pre):
                            z = pre[l, i, s]
                        v = transpose_dot(params, net, offset_next, i, width, g, width)
                        deltas[l, i, s] = v * act.derivative(z, acts[l, i, s], hidden_act)
            if ti.static(want_dx):
                if ti.static(n_layers == 1):
                    for i in range(n_in):
                        dx[b, i] = transpose_dot(params, net, 0, i, n_in, g_out, n_out)
                else:
                    g0 = load_column(deltas, 0, s, width)
                    for i in range(n_in):
                        dx[b, i] = transpose_dot(params, net, 0, i, n_in, g0, width)


@ti.func
def _accumulate_block(x: ti.template(), acts: ti.template(), from_acts: ti.template(), order: ti.template(),
                      deltas: ti.template(), dl, l, o0, t0, t1, i0, n_rows: ti.template(), n_cols: ti.template()):
    """Sum over positions s in [t0, t1) of the outer product deltas[dl, o0:o0+n_rows, s] x input_l[s, i0:i0+n_cols].

    Register tiling: n_rows + n_cols loads feed n_rows * n_cols multiply-adds.
    """
    acc = ti.Matrix.zero(ti.f32, n_rows, n_cols)
    for s in range(t0, t1):
        d = ti.Vector([deltas[dl, o0 + r, s] for r in ti.static(range(n_rows))], dt=ti.f32)
        a = ti.Vector.zero(ti.f32, n_cols)
        if ti.static(from_acts):
            a = ti.Vector([acts[l - 1, i0 + k, s] for k in ti.static(range(n_cols))], dt=ti.f32)
        else:
            b = order[s]
            a = ti.Vector([x[b, i0 + k] for k in ti.static(range(n_cols))], dt=ti.f32)
        for r, k in ti.static(ti.ndrange(n_rows, n_cols)):
            acc[r, k] += d[r] * a[k]
    return acc


@fast_kernel
@ti.kernel
def tile_weight_gradient(
    x: f32_2d, acts: f32_3d, from_acts: ti.template(), order: i32_1d,
    tile_start: i32_1d, tile_end: i32_1d, deltas: f32_3d, partial: f32_2d,
    l: ti.i32, fan_in: ti.i32, fan_out: ti.i32, offset: ti.i32, dl: ti.i32,
):
    """partial[t, W_l[o, i]] = sum over tile t's samples of deltas[dl, o, s] * input_l[s, i] (`deltas` is
    the hidden layers' buffer, dl = l, or the output's, dl = 0).

    input_l is x (layer 0) or acts[l - 1]. One thread owns (tile, block of ROWS
    outputs, block of COLS inputs) and keeps its sums in registers: no atomics,
    and each weight is written once per tile. Full blocks take a branch-free
    path; ragged edges fall back to one element at a time.
    """
    n_col_blocks = (fan_in + COLS - 1) // COLS
    n_row_blocks = (fan_out + ROWS - 1) // ROWS
    for t, rb, cb in ti.ndrange(tile_start.shape[0], n_row_blocks, n_col_blocks):
        o0 = rb * ROWS
        i0 = cb * COLS
        t0, t1 = tile_start[t], tile_end[t]
        if o0 + ROWS <= fan_out and i0 + COLS <= fan_in:
            acc = _accumulate_block(x, acts, from_acts, order, deltas, dl, l, o0, t0, t1, i0, ROWS, COLS)
            for r, k in ti.static(ti.ndrange(ROWS, COLS)):
                partial[t, offset + (o0 + r) * fan_in + i0 + k] = acc[r, k]
        else:
            for r in range(ti.min(ROWS, fan_out - o0)):
                for k in range(ti.min(COLS, fan_in - i0)):
                    acc = _accumulate_block(x, acts, from_acts, order, deltas, dl, l, o0 + r, t0, t1, i0 + k, 1,
                                            1)
                    partial[t, offset + (o0 + r) * fan_in + i0 + k] = acc[0, 0]


@fast_kernel
@ti.kernel
def reduce_tiles(partial: f32_2d, tile_net: i32_1d, grad: f32_2d, net_lo: ti.i32):
    """grad[net - net_lo] = sum of the partial gradients of the net's tiles (tiles of networks outside the
    chunk view `grad` are skipped)."""
    for t, k in partial:
        net = tile_net[t] - net_lo
        if in_chunk(net, grad):
            ti.atomic_add(grad[net, k], partial[t, k])


# ---- launchers: named argument groups in, the kernels' positional lists out --------------------------
# Every launcher that indexes a per-network table runs once per row chunk of it (tinn/chunks.py).
def run_forward(x, ids, order, params, shape: MLPShape, *, acts, pre, out, keep_all: bool, keep_pre: bool):
    for lo, hi in chunks.row_spans(params.shape[0], params.shape[1], "the network parameters"):
        forward(x, ids, order, params if hi - lo == params.shape[0] else params[lo:hi], acts, pre, out, *shape,
                keep_all, keep_pre, lo)


def run_backward_deltas(dy, ids, order, params, shape: MLPShape, *, acts, pre, out, deltas, dout, dx,
                        keep_pre: bool, want_dx: bool):
    for lo, hi in chunks.row_spans(params.shape[0], params.shape[1], "the network parameters"):
        backward_deltas(dy, ids, order, params if hi - lo == params.shape[0] else params[lo:hi], acts, pre, out,
                        deltas, dout, dx, *shape, keep_pre, want_dx, lo)


def run_weight_gradients(x, routing, shape: MLPShape, *, acts, deltas, dout, dparams):
    """Per-tile partial gradients, then one reduction per network (`routing`: order and tiles).

    The partials are (tiles, P): when they or `dparams` pass the chunk limit, tiles go in groups (tiles
    are sorted by network) and each group is reduced into the gradient chunks its networks fall in."""
    reduce = reduce_tiles_in_order if runtime.settings().deterministic else reduce_tiles
    n_params = dparams.shape[1]
    spans = chunks.row_spans(dparams.shape[0], n_params, "the network gradients")
    group = chunks.row_spans(routing.n_tiles, n_params, "the per-tile gradients")
    layers = layer_shapes(shape.n_in, shape.width, shape.n_out, shape.n_layers)
    computed = computed_params(shape)  # the partials' columns past it are zeroed once per buffer
    if len(spans) == 1 and len(group) == 1:
        partial = deltas.new_empty(routing.n_tiles, n_params)
        if computed < n_params:
            partial[:, computed:].zero_()
        _tile_gradients(x, routing.order, routing.tile_start, routing.tile_end, acts, deltas, dout, partial, layers)
        reduce(partial, routing.tile_net, dparams, 0)
        return
    tile_net = routing.tile_net.cpu().tolist()  # the slow path's one host sync: which chunks a group touches
    partial = None
    for t0, t1 in group:
        if partial is None or partial.shape[0] != t1 - t0:
            partial = deltas.new_empty(t1 - t0, n_params)
            if computed < n_params:
                partial[:, computed:].zero_()
        _tile_gradients(x, routing.order, routing.tile_start[t0:t1], routing.tile_end[t0:t1], acts, deltas, dout,
                        partial, layers)
        first, last = tile_net[t0], tile_net[t1 - 1]
        for lo, hi in spans:
            if lo <= last and first < hi:
                reduce(partial, routing.tile_net[t0:t1], dparams[lo:hi], lo)


def _tile_gradients(x, order, tile_start, tile_end, acts, deltas, dout, partial, layers):
    offset = 0
    last = len(layers) - 1
    for l, (fan_out, fan_in) in enumerate(layers):
        tile_weight_gradient(x, acts, l > 0, order, tile_start, tile_end, dout if l == last else deltas, partial, l,
                             fan_in, fan_out, offset, 0 if l == last else l)
        offset += fan_out * fan_in

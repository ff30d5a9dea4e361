"""Triton kernels of an MLP array on tensor cores: forward (inference or training) and backward.

One program per tile of samples of one network (`TileRouting`: `tile_net`, `tile_start` into the sort order
`order`, `tile_count`, 0 for a padding tile); a program walks its tile in blocks of BM samples, so tiles of any
size work, and loads each weight block once per tile. Matrix products are `tl.dot` on operands of the compute
dtype (float16, bfloat16, or float32 as TF32 or exact IEEE) with float32 accumulation; activations are computed
in float32.

Weights come packed (launch.pack_weights): layer l transposed, (fan_in block, fan_out block) row-major, zero
outside the real (fan_in, fan_out), network n's layers back to back in row n. Hidden pre-activations saved by a
training forward are indexed by sorted position: `pre[l, position, feature]`, H features a row.

The backward runs one program per chunk (tiles of any size of the same sort order) and goes layer by layer,
last first; for each layer it walks the chunk's blocks, accumulates the layer's weight gradient
`tl.dot(trans(input), delta)` in float32 registers, and writes the next layer down's deltas into a scratch
buffer (by sorted position, in place of the ones it read). Then one atomic add of the layer's accumulator into
dparams. A barrier between layers makes one layer's delta stores visible to the block's threads that read them.
"""
import triton
import triton.language as tl

# tcnn sharpens Squareplus and Softplus by this factor (a constexpr: compiled kernels read only those globals;
# the interpreter reads any, so only a GPU run catches a plain float here).
K_ACT = tl.constexpr(10.0)


@triton.jit
def _sigmoid(z):
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _act(z, CODE: tl.constexpr):
    """Activation `CODE` (tinn/activations.py) of float32 z; NaN stays NaN."""
    y = z
    if CODE == 1:
        y = tl.where(z < 0.0, 0.0, z)
    elif CODE == 2:
        y = tl.where(z > 0.0, z, 0.01 * z)
    elif CODE == 3:
        y = tl.exp(z)
    elif CODE == 4:
        y = tl.sin(z)
    elif CODE == 5:
        y = _sigmoid(z)
    elif CODE == 6:
        s = z * K_ACT
        y = 0.5 * (s + tl.sqrt(s * s + 4.0)) / K_ACT
    elif CODE == 7:
        s = z * K_ACT
        # log(1 + e^s) without overflow for large s
        y = (tl.where(s > 0.0, s, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(s)))) / K_ACT
    elif CODE == 8:
        # tanh from exp: odd series near 0, where 1 - e^{-2|z|} would cancel
        a = tl.abs(z)
        e = tl.exp(-2.0 * a)
        t = (1.0 - e) / (1.0 + e)
        z2 = z * z
        series = a * (1.0 - z2 * (1.0 / 3.0 - z2 * (2.0 / 15.0)))
        t = tl.where(a < 0.05, series, t)
        y = tl.where(z < 0.0, -t, t)
    elif CODE == 9:
        y = z * _sigmoid(z)
    return y


@triton.jit
def _dact(z, y, CODE: tl.constexpr):
    """d act / d z from the output y (tcnn's formulas), from z for Sine and SiLU."""
    d = tl.full(z.shape, 1.0, tl.float32)
    if CODE == 1:
        d = tl.where(y <= 0.0, 0.0, 1.0)
    elif CODE == 2:
        d = tl.where(y > 0.0, 1.0, 0.01)
    elif CODE == 3:
        d = y
    elif CODE == 4:
        d = tl.cos(z)
    elif CODE == 5:
        d = y * (1.0 - y)
    elif CODE == 6:
        s = y * K_ACT
        d = s * s / (s * s + 1.0)
    elif CODE == 7:
        d = 1.0 - tl.exp(-y * K_ACT)
    elif CODE == 8:
        d = 1.0 - y * y
    elif CODE == 9:
        s = _sigmoid(z)
        d = s + z * s * (1.0 - s)
    return d


@triton.jit
def _dot(a, b, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr):
    """a @ b accumulated in float32. IEEE: exact float32 products (else float32 operands run as TF32).
    INTERPRETED_BF16 (bfloat16 under Triton's CPU interpreter, which multiplies bfloat16 bit patterns as
    integers): the operands go in as float32; a product of two 16-bit floats is exact in float32, so the
    result is the same."""
    if INTERPRETED_BF16:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(a, b)
    return r


@triton.jit
def _to_compute(v, CDT: tl.constexpr, INTERPRETED_BF16: tl.constexpr):
    """float32 v in the compute dtype, rounded to nearest even. Triton's CPU interpreter truncates float32 to
    bfloat16, so there the rounding is done on the bits first (finite values)."""
    if INTERPRETED_BF16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = bits.to(tl.float32, bitcast=True)
    return v.to(CDT)


@triton.jit
def _load_input(x_ptr, sidx, rmask, s_sample, s_feature, pad_value,
                N_REAL: tl.constexpr, N_IN: tl.constexpr, K: tl.constexpr):
    """The block's inputs, (BM, K) float32: x's N_REAL columns, then N_IN - N_REAL columns of pad_value
    (tcnn's input padding), zeros up to K."""
    k = tl.arange(0, K)
    v = tl.load(x_ptr + sidx[:, None] * s_sample + k[None, :] * s_feature,
                mask=rmask[:, None] & (k < N_REAL)[None, :], other=0.0).to(tl.float32)
    if N_IN > N_REAL:
        v = tl.where(((k >= N_REAL) & (k < N_IN))[None, :], pad_value, v)
    return v


@triton.jit
def _load_weight(w_ptr, OFFSET: tl.constexpr, KIN: tl.constexpr, KOUT: tl.constexpr):
    i = tl.arange(0, KIN)
    o = tl.arange(0, KOUT)
    return tl.load(w_ptr + OFFSET + i[:, None] * KOUT + o[None, :])


@triton.jit
def pack_kernel(p_ptr, s_p_net, s_p_col, source_ptr, out_ptr, s_out_net, size, n_blocks,
                CDT: tl.constexpr, INTERPRETED_BF16: tl.constexpr, BLOCK: tl.constexpr):
    """out[n, j] = params[n, source[j]] in the compute dtype, 0 where source[j] < 0 (the blocks' padding).
    One program per (network, block of BLOCK elements), a network's blocks consecutive: programs start in
    that order, so the blocks that gather from one network's parameter row (transposed, strided reads) run
    together and find it in L2. (A 1-D grid: a second axis would cap the networks at 65535.)"""
    pid = tl.program_id(0).to(tl.int64)
    net = pid // n_blocks
    j = (pid % n_blocks).to(tl.int32) * BLOCK + tl.arange(0, BLOCK)
    inside = j < size
    column = tl.load(source_ptr + j, mask=inside, other=-1)
    v = tl.load(p_ptr + net * s_p_net + column * s_p_col, mask=column >= 0, other=0.0)
    tl.store(out_ptr + net * s_out_net + j, _to_compute(v.to(tl.float32), CDT, INTERPRETED_BF16), mask=inside)


@triton.jit
def _forward_block(
    t, count, start, x_ptr, s_x_sample, s_x_feature, pad_value, w_net, w_first, w_last,
    order_ptr, out_ptr, s_out_sample, pre_ptr, s_pre_layer,
    N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, N_OUT: tl.constexpr, N_LAYERS: tl.constexpr,
    K0: tl.constexpr, H: tl.constexpr, O: tl.constexpr, HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, SAVE: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr, IN_ORDER: tl.constexpr,
):
    """The forward of the tile's samples t .. t + BM (masked at count)."""
    o_cols = tl.arange(0, O)
    h_cols = tl.arange(0, H)
    rows = t + tl.arange(0, BM)
    rmask = rows < count
    pos = start + rows
    if IN_ORDER:  # the order is the identity: rows read and written where they lie, no gather through it
        sidx = pos
    else:
        sidx = tl.load(order_ptr + pos, mask=rmask, other=0)
    if WIDE_OFFSETS:
        sidx = sidx.to(tl.int64)
    h = _to_compute(_load_input(x_ptr, sidx, rmask, s_x_sample, s_x_feature, pad_value, N_REAL_IN, N_IN, K0),
                    CDT, INTERPRETED_BF16)
    if N_LAYERS > 1:
        z = _to_compute(_dot(h, w_first, IEEE, INTERPRETED_BF16), CDT, INTERPRETED_BF16)
        if SAVE:
            tl.store(pre_ptr + pos[:, None] * H + h_cols[None, :], z, mask=rmask[:, None])
        h = _to_compute(_act(z.to(tl.float32), HIDDEN_ACT), CDT, INTERPRETED_BF16)
        for l in tl.static_range(1, N_LAYERS - 1):
            w = _load_weight(w_net, K0 * H + (l - 1) * H * H, H, H)
            z = _to_compute(_dot(h, w, IEEE, INTERPRETED_BF16), CDT, INTERPRETED_BF16)
            if SAVE:
                tl.store(pre_ptr + l * s_pre_layer.to(tl.int64) + pos[:, None] * H + h_cols[None, :], z,
                         mask=rmask[:, None])
            h = _to_compute(_act(z.to(tl.float32), HIDDEN_ACT), CDT, INTERPRETED_BF16)
    y = _act(_dot(h, w_last, IEEE, INTERPRETED_BF16), OUTPUT_ACT)
    tl.store(out_ptr + sidx[:, None] * s_out_sample + o_cols[None, :], y,
             mask=rmask[:, None] & (o_cols < N_OUT)[None, :])


@triton.jit
def forward_kernel(
    x_ptr, s_x_sample, s_x_feature, pad_value,
    w_ptr, s_w_net,
    order_ptr, tile_net_ptr, tile_start_ptr, tile_count_ptr,
    out_ptr, s_out_sample,
    pre_ptr, s_pre_layer,
    N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, N_OUT: tl.constexpr, N_LAYERS: tl.constexpr,
    K0: tl.constexpr, H: tl.constexpr, O: tl.constexpr,
    HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, SAVE: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    INTERPRETED: tl.constexpr, WIDE_OFFSETS: tl.constexpr, IN_ORDER: tl.constexpr = False,
):
    """out[order[p]] for the tile's sorted positions p; with SAVE, pre[l, p] = layer l's pre-activation (hidden
    layers, in CDT). Hidden outputs are act(pre rounded to CDT), so a backward recomputing them from `pre` sees
    the forward's numbers."""
    pid = tl.program_id(0)
    count = tl.load(tile_count_ptr + pid)
    if count == 0:
        return
    net = tl.load(tile_net_ptr + pid).to(tl.int64)
    start = tl.load(tile_start_ptr + pid)
    if WIDE_OFFSETS:
        start = start.to(tl.int64)
    w_net = w_ptr + net * s_w_net
    if N_LAYERS == 1:
        w_last = _load_weight(w_net, 0, K0, O)
        w_first = w_last
    else:
        w_first = _load_weight(w_net, 0, K0, H)
        w_last = _load_weight(w_net, K0 * H + (N_LAYERS - 2) * H * H, H, O)
    # Triton's CPU interpreter cannot take a loaded scalar as a range bound (numpy 2); it walks the blocks with a
    # while loop, the GPU with a for loop (software-pipelined).
    if INTERPRETED:
        t = 0
        while t < count:
            _forward_block(t, count, start, x_ptr, s_x_sample, s_x_feature, pad_value, w_net, w_first, w_last,
                           order_ptr, out_ptr, s_out_sample, pre_ptr, s_pre_layer,
                           N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, H, O, HIDDEN_ACT, OUTPUT_ACT, BM, SAVE, CDT, IEEE,
                           INTERPRETED_BF16, WIDE_OFFSETS, IN_ORDER)
            t += BM
    else:
        for t in range(0, count, BM):
            _forward_block(t, count, start, x_ptr, s_x_sample, s_x_feature, pad_value, w_net, w_first, w_last,
                           order_ptr, out_ptr, s_out_sample, pre_ptr, s_pre_layer,
                           N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, H, O, HIDDEN_ACT, OUTPUT_ACT, BM, SAVE, CDT, IEEE,
                           INTERPRETED_BF16, WIDE_OFFSETS, IN_ORDER)


# Loss ids as tinn.kernels.losses numbers them (a test keeps the two in step); -1: dy comes from the caller.
NO_LOSS = tl.constexpr(-1)
L2, L1, RELATIVE_L2, RELATIVE_L1, MAPE, SMAPE, RELATIVE_L2_LUMINANCE, CROSS_ENTROPY, VARIANCE = (
    tl.constexpr(i) for i in range(9))
LOSS_EPS = tl.constexpr(0.01)  # tcnn's stabiliser in the relative losses


@triton.jit
def _column(y, cols, c):
    """y[:, c] of a (BM, K) block as a (BM,) vector."""
    return tl.sum(tl.where((cols == c)[None, :], y, 0.0), axis=1)


@triton.jit
def _loss_element(p, t, cols, N_OUT: tl.constexpr, LOSS: tl.constexpr):
    """(loss, d loss / d p) per element of predictions p against targets t, (BM, K) float32, neither divided by
    the element count: tcnn's formulas (tinn.kernels.losses.element, without a pdf)."""
    diff = p - t
    if LOSS == L2:
        v = diff * diff
        dv = 2.0 * diff
    elif LOSS == L1:
        v = tl.abs(diff)
        dv = tl.where(diff >= 0.0, 1.0, -1.0)
    elif LOSS == RELATIVE_L2:
        s = 1.0 / (p * p + LOSS_EPS)
        v = diff * diff * s
        dv = 2.0 * diff * s
    elif LOSS == RELATIVE_L1:
        s = 1.0 / (tl.abs(p) + LOSS_EPS)
        v = tl.abs(diff) * s
        dv = tl.where(diff >= 0.0, s, -s)
    elif LOSS == MAPE:
        s = 1.0 / (tl.abs(t) + LOSS_EPS)
        v = tl.abs(diff) * s
        dv = tl.where(diff >= 0.0, s, -s)
    elif LOSS == SMAPE:
        s = 1.0 / (0.5 * (tl.abs(t) + tl.abs(p)) + LOSS_EPS)
        v = tl.abs(diff) * s
        dv = tl.where(diff >= 0.0, s, -s)
    elif LOSS == RELATIVE_L2_LUMINANCE:
        # the predicted RGB's luminance (plus the second triple of 6-channel outputs), a constant in the gradient
        r = _column(p, cols, 0)
        g = _column(p, cols, 1)
        b = _column(p, cols, 2)
        if N_OUT >= 6:
            r += _column(p, cols, 3)
            g += _column(p, cols, 4)
            b += _column(p, cols, 5)
        lum = 0.299 * r + 0.587 * g + 0.114 * b
        s = (1.0 / (lum * lum + LOSS_EPS))[:, None]
        v = diff * diff * s
        dv = 2.0 * diff * s
    elif LOSS == CROSS_ENTROPY:
        v = -t * tl.log(p)
        dv = -t / p
    else:  # VARIANCE
        f = t * t
        v = f / p - f
        dv = -f / (p * p)
    return v, dv


@triton.jit
def _backward_block(
    acc, loss_acc, t, w, x_ptr, s_x_sample, s_x_feature, pad_value, dy_ptr, s_dy_sample, s_dy_feature,
    pre_ptr, s_pre_layer, delta_ptr, dx_ptr, s_dx_sample, s_dx_feature, order_ptr,
    start, count, scale, inv_scale, inv_n, part_ptr,
    L: tl.constexpr, N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, N_OUT: tl.constexpr,
    N_LAYERS: tl.constexpr, K0: tl.constexpr, H: tl.constexpr, KIN: tl.constexpr, KOUT: tl.constexpr,
    HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_PARAMS: tl.constexpr, WIDE_OFFSETS: tl.constexpr, LOSS: tl.constexpr,
    IN_ORDER: tl.constexpr,
):
    """Layer L on the chunk's samples t .. t + BM: (acc + this block's weight gradient, loss_acc), and the
    block's deltas of layer L - 1 (stored over the ones it read) or, for layer 0, its dx. With a LOSS, dy_ptr
    holds the targets: the output layer recomputes the prediction, takes the loss's gradient (times inv_n, the
    mean's 1 / element count) and adds the block's loss values to loss_acc (BM, KOUT), summed once per chunk:
    a reduction across the block's threads per block would synchronise them every block."""
    FIRST: tl.constexpr = L == 0
    LAST: tl.constexpr = L == N_LAYERS - 1
    kin = tl.arange(0, KIN)
    kout = tl.arange(0, KOUT)
    rows = t + tl.arange(0, BM)
    rmask = rows < count
    pos = start + rows
    sidx = pos if IN_ORDER else tl.load(order_ptr + pos, mask=rmask, other=0)
    if WIDE_OFFSETS:
        sidx = sidx.to(tl.int64)
    if FIRST:
        z_in = _load_input(x_ptr, sidx, rmask, s_x_sample, s_x_feature, pad_value, N_REAL_IN, N_IN, K0)
        y_in = z_in
    else:
        z_in = tl.load(pre_ptr + (L - 1) * s_pre_layer.to(tl.int64) + pos[:, None] * H + kin[None, :],
                       mask=rmask[:, None], other=0.0).to(tl.float32)
        y_in = _act(z_in, HIDDEN_ACT)
    h_in = _to_compute(y_in, CDT, INTERPRETED_BF16)
    if LAST:
        omask = rmask[:, None] & (kout < N_OUT)[None, :]
        g = tl.load(dy_ptr + sidx[:, None] * s_dy_sample + kout[None, :] * s_dy_feature,
                    mask=omask, other=0.0).to(tl.float32)
        if LOSS != NO_LOSS or OUTPUT_ACT != 0:
            z_out = _dot(h_in, w, IEEE, INTERPRETED_BF16)
            y_out = _act(z_out, OUTPUT_ACT)
        if LOSS != NO_LOSS:
            # (masked lanes hold a target of 0 and any prediction: their values and gradients are dropped)
            v, dv = _loss_element(y_out, g, kout, N_OUT, LOSS)
            loss_acc += tl.where(omask, v, 0.0)
            g = tl.where(omask, dv * inv_n, 0.0)
        g = g * scale
        if OUTPUT_ACT != 0:
            g = g * _dact(z_out, y_out, OUTPUT_ACT)
        delta = _to_compute(g, CDT, INTERPRETED_BF16)
    else:
        delta = tl.load(delta_ptr + pos[:, None] * H + kout[None, :], mask=rmask[:, None], other=0.0)
    if WANT_PARAMS:
        acc += _dot(tl.trans(h_in), delta, IEEE, INTERPRETED_BF16)
    if FIRST:
        if WANT_DX:
            dx = _dot(delta, tl.trans(w), IEEE, INTERPRETED_BF16) * inv_scale
            tl.store(dx_ptr + sidx[:, None] * s_dx_sample + kin[None, :] * s_dx_feature, dx,
                     mask=rmask[:, None] & (kin < N_REAL_IN)[None, :])
    else:
        d_in = _dot(delta, tl.trans(w), IEEE, INTERPRETED_BF16) * _dact(z_in, y_in, HIDDEN_ACT)
        tl.store(delta_ptr + pos[:, None] * H + kin[None, :], _to_compute(d_in, CDT, INTERPRETED_BF16),
                 mask=rmask[:, None])
    return acc, loss_acc


@triton.jit
def _backward_layer(
    x_ptr, s_x_sample, s_x_feature, pad_value, w_net, dy_ptr, s_dy_sample, s_dy_feature,
    pre_ptr, s_pre_layer, delta_ptr, dx_ptr, s_dx_sample, s_dx_feature, dp_net, order_ptr,
    start, count, scale, inv_scale, inv_n, part_ptr,
    L: tl.constexpr, N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, WIDTH: tl.constexpr, N_OUT: tl.constexpr,
    N_LAYERS: tl.constexpr, K0: tl.constexpr, H: tl.constexpr, O: tl.constexpr,
    HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_PARAMS: tl.constexpr, INTERPRETED: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
    LOSS: tl.constexpr, IN_ORDER: tl.constexpr,
):
    """Layer L of one chunk: its weight gradient (atomically added to dp_net) and the deltas of layer L - 1
    (into delta_ptr) or, for layer 0, dx."""
    FIRST: tl.constexpr = L == 0
    LAST: tl.constexpr = L == N_LAYERS - 1
    KIN: tl.constexpr = K0 if FIRST else H
    KOUT: tl.constexpr = O if LAST else H
    FAN_IN: tl.constexpr = N_IN if FIRST else WIDTH
    FAN_OUT: tl.constexpr = N_OUT if LAST else WIDTH
    W_OFFSET: tl.constexpr = 0 if FIRST else K0 * H + (L - 1) * H * H
    P_OFFSET: tl.constexpr = 0 if FIRST else N_IN * WIDTH + (L - 1) * WIDTH * WIDTH
    w = _load_weight(w_net, W_OFFSET, KIN, KOUT)
    acc = tl.zeros((KIN, KOUT), dtype=tl.float32)
    loss_acc = tl.zeros((BM, KOUT), dtype=tl.float32)
    # (the interpreter's while loop: see forward_kernel)
    if INTERPRETED:
        t = 0
        while t < count:
            acc, loss_acc = _backward_block(
                acc, loss_acc, t, w, x_ptr, s_x_sample, s_x_feature, pad_value, dy_ptr, s_dy_sample, s_dy_feature,
                pre_ptr, s_pre_layer, delta_ptr, dx_ptr, s_dx_sample, s_dx_feature, order_ptr,
                start, count, scale, inv_scale, inv_n, part_ptr, L, N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, H, KIN,
                KOUT, HIDDEN_ACT, OUTPUT_ACT, BM, CDT, IEEE, INTERPRETED_BF16, WANT_DX, WANT_PARAMS, WIDE_OFFSETS,
                LOSS, IN_ORDER)
            t += BM
    else:
        for t in range(0, count, BM):
            acc, loss_acc = _backward_block(
                acc, loss_acc, t, w, x_ptr, s_x_sample, s_x_feature, pad_value, dy_ptr, s_dy_sample, s_dy_feature,
                pre_ptr, s_pre_layer, delta_ptr, dx_ptr, s_dx_sample, s_dx_feature, order_ptr,
                start, count, scale, inv_scale, inv_n, part_ptr, L, N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, H, KIN,
                KOUT, HIDDEN_ACT, OUTPUT_ACT, BM, CDT, IEEE, INTERPRETED_BF16, WANT_DX, WANT_PARAMS, WIDE_OFFSETS,
                LOSS, IN_ORDER)
    if WANT_PARAMS:
        _add_weight_gradient(dp_net, P_OFFSET, acc, KIN, KOUT, FAN_IN, FAN_OUT, inv_scale)
    if LAST and LOSS != NO_LOSS:
        tl.atomic_add(part_ptr, tl.sum(tl.sum(loss_acc, axis=1), axis=0), sem="relaxed")
    # The next layer down reads the deltas this one stored, from other threads of the block.
    tl.debug_barrier()


@triton.jit
def backward_kernel(
    x_ptr, s_x_sample, s_x_feature, pad_value,
    w_ptr, s_w_net,
    order_ptr, tile_net_ptr, tile_start_ptr, tile_count_ptr,
    dy_ptr, s_dy_sample, s_dy_feature,
    pre_ptr, s_pre_layer, delta_ptr,
    dx_ptr, s_dx_sample, s_dx_feature,
    dp_ptr, s_dp_net,
    scale_ptr, lift, inv_n, parts_ptr, net_lo, net_hi,
    N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, WIDTH: tl.constexpr, N_OUT: tl.constexpr,
    N_LAYERS: tl.constexpr, K0: tl.constexpr, H: tl.constexpr, O: tl.constexpr,
    HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_PARAMS: tl.constexpr, INTERPRETED: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
    LOSS: tl.constexpr, IN_ORDER: tl.constexpr = False,
):
    """dx (scattered to the caller's rows, x's layout) and dparams (+=) of one chunk; dy is multiplied by
    the scale at `scale_ptr` (float32, read on the device: a dynamic scaler changes it without the host)
    before it meets the compute dtype, and the float32 results by its inverse; `lift`, a power of two, multiplies
    that scale (exact both ways). With a LOSS (a loss id), dy_ptr points at the targets and the output layer
    computes dy itself (the mean loss's gradient, inv_n the mean's 1 / element count: the lift brings a large
    mean's gradients back to a unit size, gradient_scaling.mean_lift); the chunk's loss sum goes to
    parts_ptr[program]. Chunks of networks outside
    [net_lo, net_hi) are skipped."""
    pid = tl.program_id(0)
    count = tl.load(tile_count_ptr + pid)
    net = tl.load(tile_net_ptr + pid).to(tl.int64)
    # A launch for the networks [net_lo, net_hi) only (a backward cut by network, tinn/gradient_pieces.py).
    if (count == 0) | (net < net_lo) | (net >= net_hi):
        return
    scale = tl.load(scale_ptr) * lift
    inv_scale = 1.0 / scale
    start = tl.load(tile_start_ptr + pid)
    if WIDE_OFFSETS:
        start = start.to(tl.int64)
    w_net = w_ptr + net * s_w_net
    dp_net = dp_ptr + net * s_dp_net
    for i in tl.static_range(N_LAYERS):
        _backward_layer(
            x_ptr, s_x_sample, s_x_feature, pad_value, w_net, dy_ptr, s_dy_sample, s_dy_feature,
            pre_ptr, s_pre_layer, delta_ptr, dx_ptr, s_dx_sample, s_dx_feature, dp_net, order_ptr,
            start, count, scale, inv_scale, inv_n, parts_ptr + pid,
            N_LAYERS - 1 - i, N_REAL_IN, N_IN, WIDTH, N_OUT, N_LAYERS, K0, H, O, HIDDEN_ACT, OUTPUT_ACT,
            BM, CDT, IEEE, INTERPRETED_BF16, WANT_DX, WANT_PARAMS, INTERPRETED, WIDE_OFFSETS, LOSS, IN_ORDER)


# ---- the backward that recomputes the forward ----------------------------------------------------------------
# For up to three hidden layers a program can hold every layer's weight gradient in registers, so one pass over a
# chunk's blocks recomputes each block's forward from x, takes the output's gradient (from dy or a loss) and runs
# the whole backward with the block's activations and deltas in registers: nothing is saved by the forward and
# no deltas go through memory between layers (the layer-by-layer backward above reads and writes both).
RECOMPUTE_MAX_LAYERS = 4


@triton.jit
def _hidden_forward(h, w, HIDDEN_ACT: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr,
                    INTERPRETED_BF16: tl.constexpr):
    """(z, y, y in CDT) of a hidden layer: z rounded to CDT as the saving forward stores it, y = act(z)."""
    z = _to_compute(_dot(h, w, IEEE, INTERPRETED_BF16), CDT, INTERPRETED_BF16).to(tl.float32)
    y = _act(z, HIDDEN_ACT)
    return z, y, _to_compute(y, CDT, INTERPRETED_BF16)


@triton.jit
def _hidden_backward(d, w, z, y, HIDDEN_ACT: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr,
                     INTERPRETED_BF16: tl.constexpr):
    """The delta at a hidden layer's pre-activation z from the delta d at the next layer's (w: that layer's)."""
    return _to_compute(_dot(d, tl.trans(w), IEEE, INTERPRETED_BF16) * _dact(z, y, HIDDEN_ACT), CDT,
                       INTERPRETED_BF16)


@triton.jit
def _recompute_block(
    acc0, acc1, acc2, accl, loss_acc, t, w0, w1, w2, wl,
    x_ptr, s_x_sample, s_x_feature, pad_value, dy_ptr, s_dy_sample, s_dy_feature, dx_ptr, s_dx_sample,
    s_dx_feature, order_ptr, start, count, scale, inv_scale, inv_n,
    N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, N_OUT: tl.constexpr, N_LAYERS: tl.constexpr, K0: tl.constexpr,
    O: tl.constexpr, HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr, BM: tl.constexpr, CDT: tl.constexpr,
    IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr, WANT_DX: tl.constexpr, WANT_PARAMS: tl.constexpr,
    WIDE_OFFSETS: tl.constexpr, LOSS: tl.constexpr, IN_ORDER: tl.constexpr,
):
    """One block of BM samples: its forward, the output's gradient, every layer's weight gradient added to the
    accumulators (acc0..acc2: the first hidden-layer matrices, accl: the output layer's) and its dx."""
    kout = tl.arange(0, O)
    rows = t + tl.arange(0, BM)
    rmask = rows < count
    sidx = start + rows if IN_ORDER else tl.load(order_ptr + start + rows, mask=rmask, other=0)
    if WIDE_OFFSETS:
        sidx = sidx.to(tl.int64)
    a0 = _to_compute(_load_input(x_ptr, sidx, rmask, s_x_sample, s_x_feature, pad_value, N_REAL_IN, N_IN, K0),
                     CDT, INTERPRETED_BF16)
    h_last = a0
    if N_LAYERS >= 2:
        z1, y1, h1 = _hidden_forward(a0, w0, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        h_last = h1
    if N_LAYERS >= 3:
        z2, y2, h2 = _hidden_forward(h1, w1, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        h_last = h2
    if N_LAYERS >= 4:
        z3, y3, h3 = _hidden_forward(h2, w2, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        h_last = h3
    z_out = _dot(h_last, wl, IEEE, INTERPRETED_BF16)
    y_out = _act(z_out, OUTPUT_ACT)
    omask = rmask[:, None] & (kout < N_OUT)[None, :]
    g = tl.load(dy_ptr + sidx[:, None] * s_dy_sample + kout[None, :] * s_dy_feature, mask=omask,
                other=0.0).to(tl.float32)
    if LOSS != NO_LOSS:
        v, dv = _loss_element(y_out, g, kout, N_OUT, LOSS)
        loss_acc += tl.where(omask, v, 0.0)
        g = tl.where(omask, dv * inv_n, 0.0)
    g = g * scale
    if OUTPUT_ACT != 0:
        g = g * _dact(z_out, y_out, OUTPUT_ACT)
    d = _to_compute(g, CDT, INTERPRETED_BF16)
    if WANT_PARAMS:
        accl += _dot(tl.trans(h_last), d, IEEE, INTERPRETED_BF16)
    if N_LAYERS >= 4:
        d = _hidden_backward(d, wl, z3, y3, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        if WANT_PARAMS:
            acc2 += _dot(tl.trans(h2), d, IEEE, INTERPRETED_BF16)
        d = _hidden_backward(d, w2, z2, y2, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        if WANT_PARAMS:
            acc1 += _dot(tl.trans(h1), d, IEEE, INTERPRETED_BF16)
        d = _hidden_backward(d, w1, z1, y1, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
    elif N_LAYERS == 3:
        d = _hidden_backward(d, wl, z2, y2, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
        if WANT_PARAMS:
            acc1 += _dot(tl.trans(h1), d, IEEE, INTERPRETED_BF16)
        d = _hidden_backward(d, w1, z1, y1, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
    elif N_LAYERS == 2:
        d = _hidden_backward(d, wl, z1, y1, HIDDEN_ACT, CDT, IEEE, INTERPRETED_BF16)
    if N_LAYERS >= 2:
        if WANT_PARAMS:
            acc0 += _dot(tl.trans(a0), d, IEEE, INTERPRETED_BF16)
    if WANT_DX:
        kin = tl.arange(0, K0)
        dx = _dot(d, tl.trans(w0), IEEE, INTERPRETED_BF16) * inv_scale
        tl.store(dx_ptr + sidx[:, None] * s_dx_sample + kin[None, :] * s_dx_feature, dx,
                 mask=rmask[:, None] & (kin < N_REAL_IN)[None, :])
    return acc0, acc1, acc2, accl, loss_acc


@triton.jit
def _add_weight_gradient(dp_net, P_OFFSET: tl.constexpr, acc, KIN: tl.constexpr, KOUT: tl.constexpr,
                         FAN_IN: tl.constexpr, FAN_OUT: tl.constexpr, inv_scale):
    """dparams[layer] += acc (acc[i, o] is dL/dW[o, i] times the scale; W row-major (fan_out, fan_in)). Relaxed:
    nothing in a kernel reads dparams, and an acquire-release atomic would fence memory."""
    kin = tl.arange(0, KIN)
    kout = tl.arange(0, KOUT)
    tl.atomic_add(dp_net + P_OFFSET + kout[None, :] * FAN_IN + kin[:, None], acc * inv_scale,
                  mask=(kin < FAN_IN)[:, None] & (kout < FAN_OUT)[None, :], sem="relaxed")


@triton.jit
def recompute_backward_kernel(
    x_ptr, s_x_sample, s_x_feature, pad_value,
    w_ptr, s_w_net,
    order_ptr, tile_net_ptr, tile_start_ptr, tile_count_ptr,
    dy_ptr, s_dy_sample, s_dy_feature,
    dx_ptr, s_dx_sample, s_dx_feature,
    dp_ptr, s_dp_net,
    scale_ptr, lift, inv_n, parts_ptr, net_lo, net_hi,
    N_REAL_IN: tl.constexpr, N_IN: tl.constexpr, WIDTH: tl.constexpr, N_OUT: tl.constexpr,
    N_LAYERS: tl.constexpr, K0: tl.constexpr, H: tl.constexpr, O: tl.constexpr,
    HIDDEN_ACT: tl.constexpr, OUTPUT_ACT: tl.constexpr,
    BM: tl.constexpr, CDT: tl.constexpr, IEEE: tl.constexpr, INTERPRETED_BF16: tl.constexpr,
    WANT_DX: tl.constexpr, WANT_PARAMS: tl.constexpr, INTERPRETED: tl.constexpr, WIDE_OFFSETS: tl.constexpr,
    LOSS: tl.constexpr, IN_ORDER: tl.constexpr = False,
):
    """`backward_kernel`'s results (dx, dparams, loss sums; the same arguments, the same scale handling) for up
    to RECOMPUTE_MAX_LAYERS layers, from x and the weights alone: each block's forward is recomputed."""
    pid = tl.program_id(0)
    count = tl.load(tile_count_ptr + pid)
    net = tl.load(tile_net_ptr + pid).to(tl.int64)
    # A launch for the networks [net_lo, net_hi) only (a backward cut by network, tinn/gradient_pieces.py).
    if (count == 0) | (net < net_lo) | (net >= net_hi):
        return
    scale = tl.load(scale_ptr) * lift
    inv_scale = 1.0 / scale
    start = tl.load(tile_start_ptr + pid)
    if WIDE_OFFSETS:
        start = start.to(tl.int64)
    w_net = w_ptr + net * s_w_net
    dp_net = dp_ptr + net * s_dp_net
    KL: tl.constexpr = K0 if N_LAYERS == 1 else H   # the output layer's fan-in block
    A0: tl.constexpr = H if N_LAYERS >= 2 else 16    # unused accumulators stay 16 x 16
    A1: tl.constexpr = H if N_LAYERS >= 3 else 16
    A2: tl.constexpr = H if N_LAYERS >= 4 else 16
    wl = _load_weight(w_net, 0 if N_LAYERS == 1 else K0 * H + (N_LAYERS - 2) * H * H, KL, O)
    w0 = wl
    w1 = wl
    w2 = wl
    if N_LAYERS >= 2:
        w0 = _load_weight(w_net, 0, K0, H)
    if N_LAYERS >= 3:
        w1 = _load_weight(w_net, K0 * H, H, H)
    if N_LAYERS >= 4:
        w2 = _load_weight(w_net, K0 * H + H * H, H, H)
    acc0 = tl.zeros((K0, A0), dtype=tl.float32)
    acc1 = tl.zeros((A1, A1), dtype=tl.float32)
    acc2 = tl.zeros((A2, A2), dtype=tl.float32)
    accl = tl.zeros((KL, O), dtype=tl.float32)
    loss_acc = tl.zeros((BM, O), dtype=tl.float32)
    # (the interpreter's while loop: see forward_kernel)
    if INTERPRETED:
        t = 0
        while t < count:
            acc0, acc1, acc2, accl, loss_acc = _recompute_block(
                acc0, acc1, acc2, accl, loss_acc, t, w0, w1, w2, wl, x_ptr, s_x_sample, s_x_feature, pad_value,
                dy_ptr, s_dy_sample, s_dy_feature, dx_ptr, s_dx_sample, s_dx_feature, order_ptr, start, count,
                scale, inv_scale, inv_n, N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, O, HIDDEN_ACT, OUTPUT_ACT, BM, CDT,
                IEEE, INTERPRETED_BF16, WANT_DX, WANT_PARAMS, WIDE_OFFSETS, LOSS, IN_ORDER)
            t += BM
    else:
        for t in range(0, count, BM):
            acc0, acc1, acc2, accl, loss_acc = _recompute_block(
                acc0, acc1, acc2, accl, loss_acc, t, w0, w1, w2, wl, x_ptr, s_x_sample, s_x_feature, pad_value,
                dy_ptr, s_dy_sample, s_dy_feature, dx_ptr, s_dx_sample, s_dx_feature, order_ptr, start, count,
                scale, inv_scale, inv_n, N_REAL_IN, N_IN, N_OUT, N_LAYERS, K0, O, HIDDEN_ACT, OUTPUT_ACT, BM, CDT,
                IEEE, INTERPRETED_BF16, WANT_DX, WANT_PARAMS, WIDE_OFFSETS, LOSS, IN_ORDER)
    if WANT_PARAMS:
        if N_LAYERS == 1:
            _add_weight_gradient(dp_net, 0, accl, K0, O, N_IN, N_OUT, inv_scale)
        else:
            _add_weight_gradient(dp_net, 0, acc0, K0, H, N_IN, WIDTH, inv_scale)
            if N_LAYERS >= 3:
                _add_weight_gradient(dp_net, N_IN * WIDTH, acc1, H, H, WIDTH, WIDTH, inv_scale)
            if N_LAYERS >= 4:
                _add_weight_gradient(dp_net, N_IN * WIDTH + WIDTH * WIDTH, acc2, H, H, WIDTH, WIDTH, inv_scale)
            _add_weight_gradient(dp_net, N_IN * WIDTH + (N_LAYERS - 2) * WIDTH * WIDTH, accl, H, O, WIDTH, N_OUT,
                                 inv_scale)
    if LOSS != NO_LOSS:
        tl.atomic_add(parts_ptr + pid, tl.sum(tl.sum(loss_acc, axis=1), axis=0), sem="relaxed")


# Strides that equal the batch size in some layout (feature-major inputs, their gradients, a transposed dy) take
# a new value with every batch size. Triton specialises integer arguments on divisibility by 16, so batch
# sizes that vary from step to step (scenes: the samples left after empty-space skipping) would compile each
# kernel twice, a pause of seconds in the middle of training. These variants keep the specialisation on a
# stride of 1 (unit strides matter for vector loads) and drop the one on alignment; `launch` picks them only
# where a stride depends on the batch, so sample-major calls keep fully specialised code.
BATCH_STRIDES = ("s_x_sample", "s_x_feature", "s_dy_sample", "s_dy_feature", "s_dx_sample", "s_dx_feature",
                 "s_out_sample")


# Pointers a program reads one value from (its tile, the scale) or adds one value to: their alignment changes
# no instruction, and the tile lists are slices at offsets that depend on the batch, so no kernel specialises on
# their alignment either.
SCALAR_POINTERS = ("tile_net_ptr", "tile_start_ptr", "tile_count_ptr", "scale_ptr", "parts_ptr")


# A backward cut by network takes a network range per launch: no specialisation on its bounds' values either.
RANGE_BOUNDS = ("net_lo", "net_hi")


def _variant(kernel, names):
    return triton.jit(kernel.fn, do_not_specialize_on_alignment=[n for n in names if n in kernel.arg_names],
                      do_not_specialize=[n for n in RANGE_BOUNDS if n in kernel.arg_names])


forward_kernel_any_batch = _variant(forward_kernel, SCALAR_POINTERS + BATCH_STRIDES)
backward_kernel_any_batch = _variant(backward_kernel, SCALAR_POINTERS + BATCH_STRIDES)
recompute_backward_kernel_any_batch = _variant(recompute_backward_kernel, SCALAR_POINTERS + BATCH_STRIDES)
forward_kernel = _variant(forward_kernel, SCALAR_POINTERS)
backward_kernel = _variant(backward_kernel, SCALAR_POINTERS)
recompute_backward_kernel = _variant(recompute_backward_kernel, SCALAR_POINTERS)

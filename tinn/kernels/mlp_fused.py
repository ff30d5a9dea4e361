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

Backward, two launches:
- `backward_deltas` mirrors the forward on tiles from the same sort: the output deltas go down
  the layers through W^T in shared memory, and each layer's deltas are written
  feature-major to global memory (as the forward keeps the activations).
- `weight_gradients` is a batched GEMM over *chunks* (up to a few thousand sorted
  samples of one network): per step it stages a few dozen samples of a layer's deltas
  and input in shared memory (coalesced reads) and every thread accumulates an
  8-row x 16-strided-column block of dW in registers; global memory sees one atomic
  add per weight per chunk. Up to 64 features the next step's samples are already
  on their way into registers while the block computes (`grad_prefetch`), which
  hides the global loads' latency. Splitting the two keeps both kernels' register blocks
  small.

CUDA only: `ti.simt.block.sync()` does not compile on the CPU backend, which
keeps the unfused kernels of `mlp_array.py`.
"""
from typing import NamedTuple

from ..backend import ti

from .. import chunks
from .basic_encodings import frequency_feature
from ..settings import Tuning
from ..settings import current_tuning as tuning
from . import activations as act
from . import losses
from .launch import fast_kernel
from .mlp_array import MLPShape, layer_shapes
from .rows import in_chunk

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

BLOCK = 128          # threads per block
LANES_S = 16         # sample lanes
LANES_O = BLOCK // LANES_S
WARPS = BLOCK // 32
MAX_FEATURES = 128   # widest layer input/output the fused path takes
SHARED_FLOATS = 12288  # 48 KB: the static shared-memory limit per block
# The tuning (unroll factors, tile sizes, weight-gradient steps) comes from tinn's Tuning record, read when a
# kernel compiles; docs/design-notes.md has what each choice measured.
GRAD_ROWS = 64       # weight-gradient rows per pass (8 per thread)
# The weight-gradient prefetch holds a step's samples in registers, this many per thread at most (what 64
# features with steps of 32 samples take, where it was first measured to pay); wider networks take shorter
# steps to keep it (`grad_step`).
GRAD_PREFETCH_REGISTERS = 32


def round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def features(n_in: int, width: int, n_out: int) -> int:
    return round_up(max(n_in, width, n_out), 16)


def _largest_tile(n_buffers: int, f: int, reserved: int = 0) -> int:
    """Largest multiple of 16 samples whose n_buffers feature-major buffers fit in 48 KB next to `reserved` floats."""
    return min(128, (((SHARED_FLOATS - reserved) // (n_buffers * f) - 1) // LANES_S) * LANES_S)


class Geometry(NamedTuple):
    tile: int           # samples per forward tile (multiple of 16)
    features: int       # F: widest layer input/output, rounded up to 16
    backward_tile: int  # samples per backward-deltas tile (multiple of 16)
    weight_rows: int = 0           # F when the forward stages each layer's weights in shared memory; 0 = read via L1
    backward_weight_rows: int = 0  # the same for backward_deltas


def weight_stride(n_cols: int) -> int:
    """Shared-memory row stride of a staged weight matrix: odd, so that a warp's column-wise stores land in
    32 different banks."""
    return n_cols | 1


def staged_weight_rows(f: int, tile: int) -> int:
    """f when a layer's whole weight matrix fits in shared memory next to a tile of `tile` samples' activations,
    else 0: staging it in parts, a barrier pair per part, was measured slower than reading it through L1."""
    return f if f * (tile + 1) + f * weight_stride(f) <= SHARED_FLOATS else 0


def staged_kernels(setting: str, n_networks: int) -> tuple[bool, bool]:
    """(forward, backward_deltas): which kernels stage weights under tuning.fused_staged_weights.

    "auto" stages the deltas kernel's always and the forward's for a single network only. Staging
    reads a layer's whole matrix before the tile's first multiply-add: with one network those reads
    hit in L1 for every tile, while with thousands of networks the forward waits on them from L2 and
    was measured slower than reading the weights through L1 as the GEMM needs them (docs/design-notes.md)."""
    if setting == "auto":
        return n_networks == 1, True
    return setting in ("forward", "both"), setting in ("backward", "both")


def geometry(n_in: int, width: int, n_out: int, n_layers: int, chosen: Tuning, n_networks: int = 1) -> Geometry:
    """Tile geometry of a network shape (and array size), fixed at construction. Smaller tiles mean smaller
    register blocks and more blocks per SM; the deltas kernel has tiles of its own, cut from the same sort."""
    f = features(n_in, width, n_out)
    cap = chosen.fused_tile
    forward = min(_largest_tile(1, f), cap)
    backward = min(_largest_tile(1, f), cap, chosen.fused_backward_tile or (32 if f <= 64 else cap))
    stage_forward, stage_backward = staged_kernels(chosen.fused_staged_weights, n_networks)
    return Geometry(forward, f, backward,
                    staged_weight_rows(f, forward) if stage_forward else 0,
                    staged_weight_rows(f, backward) if stage_backward else 0)


def grad_chunk(batch: int) -> int:
    """Samples per weight-gradient block: long enough that atomics are rare, short enough that a
    small batch still spreads over every SM (a single network's 2^18 samples make 512 blocks)."""
    want = tuning().fused_grad_chunk or batch // 512
    return max(256, min(2048, round_up(want, tuning().fused_grad_step)))


def _prefetch_registers(f: int, step: int) -> int:
    return (GRAD_ROWS + f) * step // BLOCK


def grad_step(f: int) -> int:
    """Samples per weight-gradient step for networks of `f` features: tuning.fused_grad_step, halved (down to
    8) while the prefetch of a step would not fit its registers."""
    step = tuning().fused_grad_step
    while tuning().fused_grad_prefetch and step > 8 and _prefetch_registers(f, step) > GRAD_PREFETCH_REGISTERS:
        step //= 2
    return step


def grad_prefetch(f: int) -> bool:
    """Whether weight_gradients prefetches the next step's samples for networks of `f` features."""
    return tuning().fused_grad_prefetch and _prefetch_registers(f, grad_step(f)) <= GRAD_PREFETCH_REGISTERS


def supported(n_in: int, width: int, n_out: int) -> bool:
    return max(n_in, width, n_out) <= MAX_FEATURES


@ti.func
def layer_offset(l: ti.template(), n_in: ti.template(), width: ti.template()):
    return 0 if ti.static(l == 0) else n_in * width + (l - 1) * width * width


@ti.func
def tile_gemm(sh: ti.template(), a_base, params: ti.template(), net, offset, k_count: ti.template(),
              n_cols: ti.template(), transposed: ti.template(), lane_s, lane_o,
              R: ti.template(), C: ti.template(), TSP: ti.template(), U: ti.template(),
              KC: ti.template() = 0, w_base: ti.template() = 0, tid=0):
    """acc[r, c] = sum_k A[k, lane_s + 16 r] * M[k, lane_o + 8 c], the k loop unrolled by U.

    A is feature-major in shared memory. M is the layer's weight matrix W (fan_out, fan_in): M = W^T
    (forward, k = input) or, with `transposed`, M = W (backward, k = output). Columns past n_cols are
    clamped to a valid address and ignored. With KC = 0 M is read from global memory through the L1 cache;
    with KC > 0 (room for KC >= k_count rows) the block stages M in shared memory at w_base (`stage_weights`)
    and reads it from there. The caller makes sure no thread still reads that region; the block's barrier
    after staging also publishes the caller's stores to A.
    """
    acc = ti.Matrix.zero(ti.f32, R, C)
    if ti.static(KC == 0):
        # With U > 1 the loads of the next step can be issued before the multiply-adds of this one, at
        # the price of registers (and occupancy): which wins depends on the kernel (settings fused_unroll_*).
        for kb in range(k_count // U):
            for ku in ti.static(range(U)):
                gemm_step(acc, sh, a_base, params, net, offset, kb * U + ku, k_count, n_cols, transposed,
                          lane_s, lane_o, R, C, TSP)
        for k in ti.static(range(k_count // U * U, k_count)):
            gemm_step(acc, sh, a_base, params, net, offset, k, k_count, n_cols, transposed,
                      lane_s, lane_o, R, C, TSP)
    else:
        ti.static_assert(KC >= k_count)
        stage_weights(sh, w_base, params, net, offset, k_count, n_cols, transposed, tid)
        ti.simt.block.sync()
        for kb in range(k_count // U):
            for ku in ti.static(range(U)):
                staged_step(acc, sh, a_base, w_base, kb * U + ku, n_cols, lane_s, lane_o, R, C, TSP)
        for k in ti.static(range(k_count // U * U, k_count)):
            staged_step(acc, sh, a_base, w_base, k, n_cols, lane_s, lane_o, R, C, TSP)
    return acc


@ti.func
def stage_weights(sh: ti.template(), w_base: ti.template(), params: ti.template(), net, offset,
                  k_count: ti.template(), n_cols: ti.template(), transposed: ti.template(), tid):
    """M (see tile_gemm) into sh[w_base + k * weight_stride(n_cols) + j].

    The block reads W's words in order (coalesced): W[k, j] (transposed) or W[j, k] is word `idx` of the
    layer. Every load is issued before the first store: the loads are generic and the stores shared, which
    the compiler may not reorder, so interleaving them would wait out a global load's latency per element.
    """
    size = ti.static(k_count * n_cols)
    n = ti.static((size + BLOCK - 1) // BLOCK)
    # Loads from clamped (always valid) addresses into plain values: no branch and no local array for the
    # compiler's passes to track.
    v = [params[net, offset + ti.min(q * BLOCK + tid, size - 1)] for q in ti.static(range(n))]
    for q in ti.static(range(n)):
        idx = q * BLOCK + tid
        if ti.static((q + 1) * BLOCK <= size):  # a full row of the block: no bounds test to compile
            stage_word(sh, w_base, idx, v[q], k_count, n_cols, transposed)
        elif idx < size:
            stage_word(sh, w_base, idx, v[q], k_count, n_cols, transposed)


@ti.func
def stage_word(sh: ti.template(), w_base: ti.template(), idx, value, k_count: ti.template(), n_cols: ti.template(),
               transposed: ti.template()):
    NCP = ti.static(weight_stride(n_cols))
    if ti.static(transposed):
        sh[w_base + idx // n_cols * NCP + idx % n_cols] = value
    else:  # the odd stride spreads consecutive k over the banks
        sh[w_base + idx % k_count * NCP + idx // k_count] = value


@ti.func
def staged_step(acc: ti.template(), sh: ti.template(), a_base, w_base: ti.template(), k,
                n_cols: ti.template(), lane_s, lane_o, R: ti.template(), C: ti.template(), TSP: ti.template()):
    """gemm_step with M staged in shared memory: a warp reads two weight words per load (broadcasts)."""
    NCP = ti.static(weight_stride(n_cols))
    a = ti.Vector([sh[a_base + k * TSP + r * LANES_S + lane_s] for r in ti.static(range(R))], dt=ti.f32)
    m = ti.Vector.zero(ti.f32, C)
    for c in ti.static(range(C)):
        j = c * LANES_O + lane_o
        if ti.static(n_cols % LANES_O != 0):
            j = ti.min(j, n_cols - 1)
        m[c] = sh[w_base + k * NCP + j]
    for r, c in ti.static(ti.ndrange(R, C)):
        acc[r, c] += a[r] * m[c]


@ti.func
def gemm_step(acc: ti.template(), sh: ti.template(), a_base, params: ti.template(), net, offset, k,
              k_count: ti.template(), n_cols: ti.template(), transposed: ti.template(), lane_s, lane_o,
              R: ti.template(), C: ti.template(), TSP: ti.template()):
    """One k of tile_gemm: R activations and C weights in, R * C multiply-adds into acc (by reference)."""
    a = ti.Vector([sh[a_base + k * TSP + r * LANES_S + lane_s] for r in ti.static(range(R))], dt=ti.f32)
    m = ti.Vector.zero(ti.f32, C)
    for c in ti.static(range(C)):
        j = c * LANES_O + lane_o
        if ti.static(n_cols % LANES_O != 0):
            j = ti.min(j, n_cols - 1)
        if ti.static(transposed):
            m[c] = params[net, offset + k * n_cols + j]
        else:
            m[c] = params[net, offset + j * k_count + k]
    for r, c in ti.static(ti.ndrange(R, C)):
        acc[r, c] += a[r] * m[c]


@ti.func
def in_block(i, n: ti.template(), s, count):
    """Feature i < n of sample s < count, as one `&` of both tests: an `and` becomes branches, which Taichi's
    IR passes analyse at length (compile time; docs/design-notes.md)."""
    return (i < n) & (s < count)


@ti.func
def row_element(idx, n: ti.template(), TS: ti.template(), feature_major: ti.template()):
    """(sample, feature) that a block's flat index `idx` handles when it moves a tile of TS samples x n
    features to or from a caller's array: features fastest for row-major x[sample, k], samples fastest
    for feature-major x[k, sample], so consecutive threads touch consecutive words either way."""
    s = idx % TS if ti.static(feature_major) else idx // n
    k = idx // TS if ti.static(feature_major) else idx % n
    return s, k


@ti.func
def load_rows(sh: ti.template(), base, x: ti.template(), order: ti.template(), start, count, tid,
              n: ti.template(), TS: ti.template(), TSP: ti.template(), feature_major: ti.template() = False,
              freq: ti.template() = 0, pad=0.0):
    """Tile rows x[order[start + s], 0:n] into sh[base + k * TSP + s]; zeros past `count`.

    With `feature_major` the caller's array is x[k, sample] (an encoding's output as its kernel
    wrote it): the loop then walks samples fastest, coalesced when the order is the identity.
    With `freq` > 0 the rows are the Frequency encoding of x's rows (raw positions, row-major), by the
    encoding's own `frequency_feature`, then the network's input padding `pad`: an inference that needs no
    encoded features in memory.
    """
    for j in range((TS * n + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        s, k = row_element(idx, n, TS, feature_major)
        if k < n and s < TS:
            v = 0.0
            if s < count:
                if ti.static(freq > 0):
                    v = pad
                    if k < x.shape[1] * 2 * freq:
                        v = frequency_feature(x, order[start + s], k, freq)
                elif ti.static(feature_major):
                    v = x[k, order[start + s]]
                else:
                    v = x[order[start + s], k]
            sh[base + k * TSP + s] = v


@ti.func
def store_block(sh: ti.template(), base, acc: ti.template(), lane_s, lane_o, n_rows: ti.template(),
                R: ti.template(), C: ti.template(), TSP: ti.template()):
    """Register block back to feature-major shared memory (rows < n_rows)."""
    for r, c in ti.static(ti.ndrange(R, C)):
        o = c * LANES_O + lane_o
        if ti.static(n_rows % LANES_O == 0):  # every row is one: no test to compile
            sh[base + o * TSP + r * LANES_S + lane_s] = acc[r, c]
        elif o < n_rows:
            sh[base + o * TSP + r * LANES_S + lane_s] = acc[r, c]


@ti.func
def write_rows(sh: ti.template(), base, y: ti.template(), order: ti.template(), start, count, tid,
               n: ti.template(), TS: ti.template(), TSP: ti.template(), feature_major: ti.template() = False):
    """Feature-major tile back to caller rows y[order[start + s], 0:n] (coalesced along the row), or
    with `feature_major` to y[k, order[start + s]]."""
    for j in range((TS * n + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        s, k = row_element(idx, n, TS, feature_major)
        if k < n and s < count:
            if ti.static(feature_major):
                y[k, order[start + s]] = sh[base + k * TSP + s]
            else:
                y[order[start + s], k] = sh[base + k * TSP + s]


@fast_kernel(ir_passes=False)
@ti.kernel
def forward(
    x: f32_2d, order: i32_1d, tile_net: i32_1d, tile_start: i32_1d, tile_count: i32_1d, params: f32_2d,
    acts: f32_3d, out: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), keep_all: ti.template(),
    TS: ti.template(), F: ti.template(), x_feature_major: ti.template(), freq: ti.template(), KC: ti.template(),
    pad: ti.f32, net_lo: ti.i32,
):
    """out = MLP(x) per sample; keep_all stores every hidden activation in acts[l, feature, sorted position].
    x_feature_major: x is feature-major, (n_in, batch). freq > 0: x holds raw positions whose Frequency encoding (that
    many octaves, then the input padding `pad`) is the network's input (see `load_rows`). KC > 0: weights
    staged in shared memory, KC rows at a time (see tile_gemm)."""
    TSP = ti.static(TS + 1)
    R = ti.static(TS // LANES_S)
    A = ti.static(0)
    W = ti.static(F * TSP)  # staged weights
    U = ti.static(tuning().fused_unroll_forward)
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((F * TSP + KC * (F + 1),), ti.f32)
        count = tile_count[t]
        net = tile_net[t] - net_lo
        # Uniform per block: padding tiles and tiles of networks outside this chunk skip every barrier together.
        if count > 0 and in_chunk(net, params):
            start = tile_start[t]
            load_rows(sh, A, x, order, start, count, tid, n_in, TS, TSP, x_feature_major, freq, pad)
            if ti.static(KC == 0):  # (staging's own barrier publishes A otherwise)
                ti.simt.block.sync()
            for l in ti.static(range(n_layers)):
                fan_in = ti.static(n_in if l == 0 else width)
                fan_out = ti.static(n_out if l == n_layers - 1 else width)
                C = ti.static((fan_out + LANES_O - 1) // LANES_O)
                acc = tile_gemm(sh, A, params, net, layer_offset(l, n_in, width), fan_in, fan_out, False,
                                lane_s, lane_o, R, C, TSP, U, KC, W, tid)
                for r, c in ti.static(ti.ndrange(R, C)):
                    acc[r, c] = act.apply(acc[r, c], hidden_act if ti.static(l < n_layers - 1) else output_act)
                ti.simt.block.sync()
                store_block(sh, A, acc, lane_s, lane_o, fan_out, R, C, TSP)
                if ti.static(keep_all and l < n_layers - 1):
                    # A register block covers C * LANES_O features, past the width where it is not a multiple of
                    # LANES_O: those columns hold copies of the last one and must not reach acts, whose next row
                    # past the width is another layer's or outside the buffer.
                    for r, c in ti.static(ti.ndrange(R, C)):
                        s = r * LANES_S + lane_s
                        if in_block(c * LANES_O + lane_o, fan_out, s, count):
                            acts[l, c * LANES_O + lane_o, start + s] = acc[r, c]
                if ti.static(KC == 0 or l == n_layers - 1):
                    ti.simt.block.sync()
            write_rows(sh, A, out, order, start, count, tid, n_out, TS, TSP)
            ti.simt.block.sync()


@fast_kernel
@ti.kernel
def backward_deltas(
    dy: f32_2d, order: i32_1d, tile_net: i32_1d, tile_start: i32_1d, tile_count: i32_1d,
    params: f32_2d, acts: f32_3d, out: f32_2d, deltas: f32_3d, dout: f32_3d, dx: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(),
    hidden_act: ti.template(), output_act: ti.template(), want_dx: ti.template(), TS: ti.template(),
    F: ti.template(), x_feature_major: ti.template(), KC: ti.template(), net_lo: ti.i32,
    target: f32_2d, loss_parts: f32_1d, inv_n: ti.f32, LOSS: ti.template(),
):
    """The forward's mirror image, on tiles from its sort: deltas[l, o, position] = dLoss/d(output o of layer l)
    (pre-activation; the network output's in dout[0, o, position]), layer by layer downwards with W^T;
    dx = the deltas of the input when want_dx (feature-major, (n_in, batch), with x_feature_major). KC as in the
    forward.

    LOSS >= 0 (a loss id of kernels/losses.py): dy is not read; the output's gradient is that loss's of `out`
    against `target`, divided by the element count (inv_n = 1 / (batch * n_out)), and each warp writes the sum
    of its elements' loss values to loss_parts[WARPS * tile + warp] (the loss kernel's pass over the outputs is
    then not needed)."""
    TSP = ti.static(TS + 1)
    R = ti.static(TS // LANES_S)
    G = ti.static(0)
    W = ti.static(F * TSP)
    last = ti.static(n_layers - 1)
    lowest = ti.static(0 if want_dx else 1)  # the last layer whose deltas GEMM runs
    shapes = ti.static(layer_shapes(n_in, width, n_out, n_layers))
    U = ti.static(tuning().fused_unroll_backward)
    ti.loop_config(block_dim=BLOCK)
    for g in range(tile_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_s = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray((F * TSP + KC * (F + 1),), ti.f32)
        count = tile_count[t]
        net = tile_net[t] - net_lo
        if count > 0 and in_chunk(net, params):
            start = tile_start[t]
            # Output deltas: dy times the output activation's derivative (taken from the output).
            part = 0.0
            for j in range((TS * n_out + BLOCK - 1) // BLOCK):
                idx = j * BLOCK + tid
                s = idx // n_out
                o = idx % n_out
                if s < TS:
                    v = 0.0
                    if s < count:
                        b = order[start + s]
                        grad = 0.0
                        if ti.static(LOSS >= 0):
                            value, d_value = losses.element(LOSS, out, b, o, target[b, o], 1.0)
                            part += value
                            grad = d_value * inv_n
                        else:
                            grad = dy[b, o]
                        v = grad * act.derivative(0.0, out[b, o], output_act)
                    sh[G + o * TSP + s] = v
            if ti.static(LOSS >= 0):  # the warp's sum, in a fixed order
                for m in ti.static((16, 8, 4, 2, 1)):
                    part += ti.simt.warp.shfl_down_f32(ti.u32(0xFFFFFFFF), part, m)
                if tid % 32 == 0:
                    loss_parts[t * WARPS + tid // 32] = part
            ti.simt.block.sync()
            for j in range((TS * n_out + BLOCK - 1) // BLOCK):  # feature-major copy for weight_gradients
                idx = j * BLOCK + tid
                o = idx // TS
                s = idx % TS
                if o < n_out and s < count:
                    dout[0, o, start + s] = sh[G + o * TSP + s]
            for q in ti.static(range(n_layers)):
                l = ti.static(last - q)
                if ti.static(l > 0 or want_dx):
                    fan_out, fan_in = ti.static(shapes[l])
                    C = ti.static((fan_in + LANES_O - 1) // LANES_O)
                    # The hidden activation's derivative (layer l-1's output is layer l's input), loaded
                    # before the GEMM, whose work hides the loads' latency. Loaded from a clamped (valid)
                    # address and zeroed outside the block by a select, not a branch: the branch-free form
                    # measured faster (docs/design-notes.md).
                    slope = ti.Matrix.zero(ti.f32, R, C)
                    if ti.static(l > 0):
                        for r, c in ti.static(ti.ndrange(R, C)):
                            i = c * LANES_O + lane_o
                            s = r * LANES_S + lane_s
                            y = acts[l - 1, ti.min(i, fan_in - 1), start + ti.min(s, count - 1)]
                            slope[r, c] = ti.select(in_block(i, fan_in, s, count),
                                                    act.derivative(0.0, y, hidden_act), 0.0)
                    acc = tile_gemm(sh, G, params, net, layer_offset(l, n_in, width), fan_out, fan_in, True,
                                    lane_s, lane_o, R, C, TSP, U, KC, W, tid)
                    if ti.static(l > 0):
                        for r, c in ti.static(ti.ndrange(R, C)):
                            i = c * LANES_O + lane_o
                            s = r * LANES_S + lane_s
                            inside = in_block(i, fan_in, s, count)
                            v = ti.select(inside, acc[r, c] * slope[r, c], 0.0)
                            if inside:
                                deltas[l - 1, i, start + s] = v
                            acc[r, c] = v
                    ti.simt.block.sync()
                    store_block(sh, G, acc, lane_s, lane_o, fan_in, R, C, TSP)
                    if ti.static(KC == 0 or l == lowest):
                        ti.simt.block.sync()
            if ti.static(want_dx):
                write_rows(sh, G, dx, order, start, count, tid, n_in, TS, TSP, x_feature_major)
                ti.simt.block.sync()


@ti.func
def load_features(sh: ti.template(), base, src: ti.template(), l: ti.template(), row0: ti.template(),
                  rows: ti.template(), start, count, tid, KS: ti.template(), KSP: ti.template()):
    """src[l, row0 + k, start + s] for k < rows, s < KS into sh[base + k * KSP + s] (zeros past count)."""
    for j in range((rows * KS + BLOCK - 1) // BLOCK):
        idx = j * BLOCK + tid
        s, k = row_element(idx, rows, KS, True)  # global src[l, row0 + k, sample] is feature-major
        if k < rows:
            v = 0.0
            if s < count:
                v = src[l, row0 + k, start + s]
            sh[base + k * KSP + s] = v


@ti.func
def fetch_features(src: ti.template(), l: ti.template(), row0: ti.template(), rows: ti.template(), start, count,
                   tid, KS: ti.template()):
    """This thread's share of `load_features`' values, in registers (zeros past count)."""
    v = ti.Vector.zero(ti.f32, (rows * KS + BLOCK - 1) // BLOCK)
    for j in ti.static(range((rows * KS + BLOCK - 1) // BLOCK)):
        idx = j * BLOCK + tid
        s, k = row_element(idx, rows, KS, True)  # global src[l, row0 + k, sample] is feature-major
        if k < rows and s < count:
            v[j] = src[l, row0 + k, start + s]
    return v


@ti.func
def store_features(sh: ti.template(), base, v: ti.template(), rows: ti.template(), tid, KS: ti.template(),
                   KSP: ti.template()):
    """`fetch_features`' registers into shared memory, where `load_features` puts them."""
    for j in ti.static(range((rows * KS + BLOCK - 1) // BLOCK)):
        idx = j * BLOCK + tid
        s, k = row_element(idx, rows, KS, True)
        if k < rows:
            sh[base + k * KSP + s] = v[j]


@ti.func
def fetch_rows(x: ti.template(), order: ti.template(), start, count, tid, n: ti.template(), TS: ti.template(),
               feature_major: ti.template()):
    """This thread's share of `load_rows`' values, in registers (zeros past count)."""
    v = ti.Vector.zero(ti.f32, (TS * n + BLOCK - 1) // BLOCK)
    for j in ti.static(range((TS * n + BLOCK - 1) // BLOCK)):
        idx = j * BLOCK + tid
        s, k = row_element(idx, n, TS, feature_major)
        if k < n and s < count:
            if ti.static(feature_major):
                v[j] = x[k, order[start + s]]
            else:
                v[j] = x[order[start + s], k]
    return v


@ti.func
def store_rows(sh: ti.template(), base, v: ti.template(), tid, n: ti.template(), TS: ti.template(),
               TSP: ti.template(), feature_major: ti.template()):
    """`fetch_rows`' registers into shared memory, where `load_rows` puts them."""
    for j in ti.static(range((TS * n + BLOCK - 1) // BLOCK)):
        idx = j * BLOCK + tid
        s, k = row_element(idx, n, TS, feature_major)
        if k < n and s < TS:
            sh[base + k * TSP + s] = v[j]


@ti.func
def accumulate_step(acc: ti.template(), sh: ti.template(), GB: ti.template(), HB: ti.template(), lane_o, lane_i,
                    RW: ti.template(), CW: ti.template(), KS: ti.template(), KSP: ti.template()):
    """acc[r, c] += sum over the KS staged samples of delta row (r, lane_o) times input column (c, lane_i)."""
    U = ti.static(tuning().fused_unroll_backward)
    for sb in range(KS // U):
        for su in ti.static(range(U)):
            s = sb * U + su
            d = ti.Vector([sh[GB + (r * LANES_O + lane_o) * KSP + s] for r in ti.static(range(RW))], dt=ti.f32)
            h = ti.Vector([sh[HB + (c * LANES_S + lane_i) * KSP + s] for c in ti.static(range(CW))], dt=ti.f32)
            for r, c in ti.static(ti.ndrange(RW, CW)):
                acc[r, c] += d[r] * h[c]


@fast_kernel(ir_passes=False)
@ti.kernel
def weight_gradients(
    x: f32_2d, order: i32_1d, chunk_net: i32_1d, chunk_start: i32_1d, chunk_count: i32_1d,
    acts: f32_3d, deltas: f32_3d, dout: f32_3d, dparams: f32_2d,
    n_in: ti.template(), width: ti.template(), n_out: ti.template(), n_layers: ti.template(), F: ti.template(),
    x_feature_major: ti.template(), net_lo: ti.i32,
):
    """dparams[net] += sum over a chunk's samples of deltas[l] (x) input[l], one block per chunk of one network.

    A batched GEMM with the samples as the long inner dimension: per step `grad_step(F)` samples of the
    deltas (up to GRAD_ROWS rows per pass) and of the layer input are staged in shared memory with
    coalesced feature-major reads, and each thread keeps an (8 rows x 16-strided columns) register block.
    Global memory sees one atomic add per weight per chunk. With `grad_prefetch(F)` each step's global
    loads are issued before the previous step's GEMM and land in registers (fetch_*/store_*).
    """
    KS = ti.static(grad_step(F))
    KSP = ti.static(KS + 1)
    GB = ti.static(0)                 # deltas rows of this pass
    HB = ti.static(GRAD_ROWS * KSP)   # the layer's input
    shapes = ti.static(layer_shapes(n_in, width, n_out, n_layers))
    ti.loop_config(block_dim=BLOCK)
    for g in range(chunk_net.shape[0] * BLOCK):
        t = g // BLOCK
        tid = g % BLOCK
        lane_i = tid % LANES_S
        lane_o = tid // LANES_S
        sh = ti.simt.block.SharedArray(((GRAD_ROWS + F) * KSP,), ti.f32)
        total = chunk_count[t]
        net = chunk_net[t] - net_lo
        if total > 0 and in_chunk(net, dparams):
            for l in ti.static(range(n_layers)):
                fan_out, fan_in = ti.static(shapes[l])
                CW = ti.static((fan_in + LANES_S - 1) // LANES_S)
                # The output layer's deltas have a buffer of their own (see backward_deltas).
                dsrc = ti.static(dout if ti.static(l == n_layers - 1) else deltas)
                dl = ti.static(0 if l == n_layers - 1 else l)
                for p in ti.static(range((fan_out + GRAD_ROWS - 1) // GRAD_ROWS)):
                    row0 = ti.static(p * GRAD_ROWS)
                    rows = ti.static(min(GRAD_ROWS, fan_out - p * GRAD_ROWS))
                    RW = ti.static((rows + LANES_O - 1) // LANES_O)
                    acc = ti.Matrix.zero(ti.f32, RW, CW)
                    n_steps = (total + KS - 1) // KS
                    first = chunk_start[t]
                    if ti.static(grad_prefetch(F)):
                        # Registers hold the next step's samples while the block computes on the current ones.
                        dv = fetch_features(dsrc, dl, row0, rows, first, ti.min(KS, total), tid, KS)
                        # (declared out here: a static if's branch is a scope of its own)
                        hv = ti.Vector.zero(ti.f32, (KS * (n_in if ti.static(l == 0) else fan_in) + BLOCK - 1) // BLOCK)
                        if ti.static(l == 0):
                            hv = fetch_rows(x, order, first, ti.min(KS, total), tid, n_in, KS, x_feature_major)
                        else:
                            hv = fetch_features(acts, l - 1, 0, fan_in, first, ti.min(KS, total), tid, KS)
                        for step in range(n_steps):
                            store_features(sh, GB, dv, rows, tid, KS, KSP)
                            if ti.static(l == 0):
                                store_rows(sh, HB, hv, tid, n_in, KS, KSP, x_feature_major)
                            else:
                                store_features(sh, HB, hv, fan_in, tid, KS, KSP)
                            ti.simt.block.sync()
                            if step + 1 < n_steps:
                                start = first + (step + 1) * KS
                                count = ti.min(KS, total - (step + 1) * KS)
                                dv = fetch_features(dsrc, dl, row0, rows, start, count, tid, KS)
                                if ti.static(l == 0):
                                    hv = fetch_rows(x, order, start, count, tid, n_in, KS, x_feature_major)
                                else:
                                    hv = fetch_features(acts, l - 1, 0, fan_in, start, count, tid, KS)
                            accumulate_step(acc, sh, GB, HB, lane_o, lane_i, RW, CW, KS, KSP)
                            ti.simt.block.sync()
                    else:
                        for step in range(n_steps):
                            start = first + step * KS
                            count = ti.min(KS, total - step * KS)
                            load_features(sh, GB, dsrc, dl, row0, rows, start, count, tid, KS, KSP)
                            if ti.static(l == 0):
                                load_rows(sh, HB, x, order, start, count, tid, n_in, KS, KSP, x_feature_major)
                            else:
                                load_features(sh, HB, acts, l - 1, 0, fan_in, start, count, tid, KS, KSP)
                            ti.simt.block.sync()
                            accumulate_step(acc, sh, GB, HB, lane_o, lane_i, RW, CW, KS, KSP)
                            ti.simt.block.sync()
                    offset = layer_offset(l, n_in, width)
                    for r, c in ti.static(ti.ndrange(RW, CW)):
                        o = row0 + r * LANES_O + lane_o
                        i = c * LANES_S + lane_i
                        if o < fan_out and i < fan_in:
                            ti.atomic_add(dparams[net, offset + o * fan_in + i], acc[r, c])


# ---- launchers: named argument groups in, the kernels' positional lists out --------------------------
# `tiles` is any record with int32 `order`, `tile_net`, `tile_start`, `tile_count` (tinn.routing.TileRouting).
# Every launcher runs once per row chunk of the table it indexes (tinn/chunks.py); each launch walks all
# tiles and skips those of networks outside its chunk.
def run_forward(x, tiles, params, shape: MLPShape, geometry: Geometry, *, acts, out, keep_all: bool,
                x_feature_major: bool, frequencies: int = 0, pad: float = 0.0):
    """`frequencies` > 0: x holds raw positions, encoded by the Frequency encoding inside the kernel."""
    for lo, hi in chunks.row_spans(params.shape[0], params.shape[1], "the network parameters"):
        forward(x, tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count,
                params if hi - lo == params.shape[0] else params[lo:hi], acts, out, *shape,
                keep_all, geometry.tile, geometry.features, x_feature_major, frequencies, geometry.weight_rows, pad, lo)


def run_backward_deltas(dy, tiles, params, shape: MLPShape, geometry: Geometry, *, acts, out, deltas, dout, dx,
                        want_dx: bool, x_feature_major: bool, loss=None):
    """`loss` = (loss id, target, loss_parts, 1 / the elements its mean divides by): the output's gradient from
    that loss (dy unused), its per-warp sums into loss_parts, zeros of WARPS floats per tile (see
    backward_deltas)."""
    kind, target, parts, inv_n = loss if loss is not None else (-1, out, out[0, :1], 1.0)
    for lo, hi in chunks.row_spans(params.shape[0], params.shape[1], "the network parameters"):
        backward_deltas(dy, tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count,
                        params if hi - lo == params.shape[0] else params[lo:hi], acts, out, deltas, dout,
                        dx, *shape, want_dx, geometry.backward_tile, geometry.features, x_feature_major,
                        geometry.backward_weight_rows, lo, target, parts, inv_n, kind)


def run_weight_gradients(x, chunk_tiles, shape: MLPShape, geometry: Geometry, *, acts, deltas, dout, dparams,
                         x_feature_major: bool):
    for lo, hi in chunks.row_spans(dparams.shape[0], dparams.shape[1], "the network gradients"):
        weight_gradients(x, chunk_tiles.order, chunk_tiles.tile_net, chunk_tiles.tile_start, chunk_tiles.tile_count,
                         acts, deltas, dout, dparams if hi - lo == dparams.shape[0] else dparams[lo:hi],
                         shape.n_in, shape.width, shape.n_out, shape.n_layers, geometry.features, x_feature_major, lo)

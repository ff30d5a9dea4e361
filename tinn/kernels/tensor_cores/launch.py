"""Launchers of the tensor-core MLP kernels (tinn/kernels/tensor_cores/mlp.py): packing, forward, backward."""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import runtime
from ...routing import TileRouting
from ..mlp_array import MLPShape
from . import mlp
from .geometry import DEFAULT_GRADIENT_SCALES, PRECISIONS, Geometry, supported

COMPUTE_DTYPES = {"float32": torch.float32, "tf32": torch.float32, "float16": torch.float16,
                  "bfloat16": torch.bfloat16}
_TRITON_DTYPES = {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}


def _interpreting() -> bool:
    """Whether the kernels run under Triton's CPU interpreter: fixed when their module was imported (Triton
    reads TRITON_INTERPRET as it decorates them)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(mlp.forward_kernel, InterpretedFunction)


def default_block_m(device: torch.device) -> int:
    """Samples a program multiplies at once: 128 on the GPU; 16 under Triton's CPU interpreter (numpy)."""
    return 128 if device.type == "cuda" and not _interpreting() else 16


class Packed(NamedTuple):
    """Weights packed for the kernels: (n_networks, geometry.packed_size) in the compute dtype."""
    weights: torch.Tensor
    geometry: Geometry
    precision: str
    row_length: int      # parameters per network in tinn's flat row (with tcnn's padded output rows)


class Saved(NamedTuple):
    """What a training forward keeps for `backward`."""
    x: torch.Tensor
    x_feature_major: bool
    input_padding: tuple[int, float]
    pre: torch.Tensor | None   # (hidden layers, batch, H) pre-activations by sorted position, compute dtype
    tiles: TileRouting
    packed: Packed
    shape: MLPShape
    recompute: bool = False    # pre is None: the backward recomputes the forward (mlp.recompute_backward_kernel)


def _check(shape: MLPShape, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not supported; allowed: {list(PRECISIONS)}")
    if not supported(shape):
        raise ValueError(f"shape {shape} is not supported by the tensor-core kernels (see geometry.supported)")


@torch.no_grad()
def pack_weights(params: torch.Tensor, shape: MLPShape, precision: str, pad_output_to_hidden: bool = True
                 ) -> Packed:
    """tinn's (N, P) float32 parameters as the kernels' packed weights: each layer transposed, zero-padded to its
    blocks, in the precision's compute dtype. One gather kernel (mlp.pack_kernel) through a per-shape index map,
    which also writes the padding's zeros. `pad_output_to_hidden`: the last layer's output block at least as
    wide as the hidden one (geometry.py says why)."""
    _check(shape, precision)
    g = Geometry.of(shape, pad_output_to_hidden)
    n = params.shape[0]
    packed = torch.empty(n, g.packed_size, dtype=COMPUTE_DTYPES[precision], device=params.device)
    if n and g.packed_size:
        source = _pack_sources(g, params.device)
        block = 1024
        n_blocks = triton.cdiv(g.packed_size, block)
        mlp.pack_kernel[(n * n_blocks,)](
            params, params.stride(0), params.stride(1), source, packed, packed.stride(0), g.packed_size, n_blocks,
            CDT=_TRITON_DTYPES[packed.dtype], INTERPRETED_BF16=_interpreting() and precision == "bfloat16",
            BLOCK=block)
    return Packed(packed, g, precision, params.shape[1])


_PACK_SOURCES: dict[tuple[Geometry, torch.device], torch.Tensor] = {}


def _pack_sources(g: Geometry, device: torch.device) -> torch.Tensor:
    """int32 (packed_size,): for each packed element, its column in tinn's parameter row, or -1 for padding.
    Made once per (geometry, device) and kept: a few shapes per process, each a few thousand entries."""
    key = (g, device)
    source = _PACK_SOURCES.get(key)
    if source is None:
        index = torch.full((g.packed_size,), -1, dtype=torch.int32)
        for (fan_out, fan_in), p_off, (kin, kout), w_off in zip(g.fans, g.param_offsets, g.blocks,
                                                               g.packed_offsets):
            block = index[w_off:w_off + kin * kout].view(kin, kout)
            i = torch.arange(fan_in, dtype=torch.int32)[:, None]
            o = torch.arange(fan_out, dtype=torch.int32)[None, :]
            block[:fan_in, :fan_out] = p_off + o * fan_in + i      # packed [i, o] = W[o, i]
        source = _PACK_SOURCES[key] = index.to(device)
    return source


class LaunchOptions(NamedTuple):
    block_m: int      # samples a program multiplies at once
    num_warps: int
    num_stages: int   # Triton's software pipelining depth of the block loops (shared memory grows with it)


#: The kernels `launch_options` chooses for: a forward that saves nothing, one that saves the pre-activations
#: for the backward, a backward to the weights only, and one to the inputs too, then the same two for the
#: backward that recomputes the forward.
KERNELS = ("inference", "forward", "backward", "backward_dx", "recompute", "recompute_dx")

# (samples a block, warps, pipeline stages) of each 16-bit kernel, for layers up to 64 wide and up to 128 wide:
# each kernel's fastest in a sweep of the three on sm_90 (benchmarks/tools/tensor_core_tuning.py; inference over
# its longer tiles, benchmarks/tools/inference_check.py; the design notes give the numbers).
_TUNED_16BIT = {
    64: {"inference": (128, 4, 3), "forward": (64, 4, 2), "backward": (64, 4, 1), "backward_dx": (64, 4, 1),
         "recompute": (64, 4, 2), "recompute_dx": (64, 4, 3)},
    128: {"inference": (128, 4, 1), "forward": (64, 4, 1), "backward": (128, 8, 3), "backward_dx": (128, 8, 3),
          "recompute": (32, 8, 1), "recompute_dx": (32, 8, 1)},
}


def launch_options(geometry: Geometry, precision: str, device: torch.device, block_m: int | None = None,
                   kernel: str = "forward") -> LaunchOptions:
    """Block size, warps and pipelining depth of a shape and kernel (one of KERNELS). 16-bit kernels take their
    measured options (`_TUNED_16BIT`). float32 operands (exact and TF32) take the choice made from the registers
    and spills that ptxas reports for sm_90 (benchmarks/tools/tensor_core_compile.py): eight warps, one pipeline
    stage (with two, ptxas spills heavily), TF32 128 samples a block for layers up to 64 wide and 64 for 128-wide
    ones, exact float32 (whose dots are FMA loops) half that. 16 samples under the CPU interpreter; `block_m`
    overrides the block size."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r}; allowed: {list(KERNELS)}")
    widest = max(geometry.k0, geometry.h, geometry.o)
    sixteen_bit = COMPUTE_DTYPES[precision] != torch.float32
    if default_block_m(device) < 128:   # Triton's CPU interpreter: small blocks, the options do not matter
        return LaunchOptions(block_m or default_block_m(device), 8, 2 if sixteen_bit else 1)
    if sixteen_bit:
        bm, warps, stages = _TUNED_16BIT[64 if widest <= 64 else 128][kernel]
        return LaunchOptions(block_m or bm, warps, stages)
    bm = 128 if widest <= 64 else 64
    if precision == "float32":
        bm //= 2
    return LaunchOptions(block_m or bm, 8, 1)


def kernel_constants(shape: MLPShape, g: Geometry, precision: str, n_real_in: int, options: LaunchOptions) -> dict:
    """The compile-time arguments (and launch options) both kernels share."""
    return dict(N_REAL_IN=n_real_in, N_IN=shape.n_in, N_OUT=shape.n_out, N_LAYERS=shape.n_layers,
                K0=g.k0, H=max(g.h, 16), O=g.o, HIDDEN_ACT=shape.hidden_act, OUTPUT_ACT=shape.output_act,
                CDT=_TRITON_DTYPES[COMPUTE_DTYPES[precision]], IEEE=precision == "float32",
                INTERPRETED_BF16=_interpreting() and precision == "bfloat16", INTERPRETED=_interpreting(),
                BM=options.block_m, num_warps=options.num_warps, num_stages=options.num_stages)


# Element offsets the kernels compute stay in int32 (fewer registers per gathered row) below this bound.
_INT32_OFFSETS = 2**31 - 1


def _wide_offsets(batch: int, *operands: tuple[tuple[int, int], int]) -> bool:
    """Whether an offset into an operand can pass int32: each operand as ((sample stride, feature stride), the
    block's feature count), offsets reaching the padded block's last feature of the last sample."""
    return any((batch - 1) * abs(s) + (k - 1) * abs(f) >= _INT32_OFFSETS for (s, f), k in operands)


def _kernel_for(aligned, any_batch, batch: int, *strides: int):
    """The kernel variant for these stride arguments: `any_batch` (no divisibility specialisation on the
    strides, mlp.BATCH_STRIDES) where one of them grows with the batch (a feature-major layout), so that varying
    batch sizes reuse one compiled kernel; else the fully specialised `aligned` one."""
    return any_batch if batch > 1 and any(s >= batch for s in strides) else aligned


def _feature_strides(x: torch.Tensor, feature_major: bool) -> tuple[int, int]:
    """(stride between samples, stride between features) of a 2-D tensor in either layout."""
    return (x.stride(1), x.stride(0)) if feature_major else (x.stride(0), x.stride(1))


def recomputes(shape: MLPShape) -> bool:
    """Whether `backward` can recompute this shape's forward (mlp.recompute_backward_kernel: every layer's weight
    gradient in one program's registers), so that a training forward need save no activations."""
    return shape.n_layers <= mlp.RECOMPUTE_MAX_LAYERS


def _check_recomputes(shape: MLPShape) -> None:
    if not recomputes(shape):
        raise ValueError(f"recompute: the backward recomputes at most {mlp.RECOMPUTE_MAX_LAYERS} layers, the shape "
                         f"has {shape.n_layers}")


def _check_input(x: torch.Tensor, x_feature_major: bool, n_real_in: int) -> None:
    if x.dim() != 2 or (x.shape[0] if x_feature_major else x.shape[1]) != n_real_in:
        raise ValueError(f"x has shape {tuple(x.shape)}; expected {n_real_in} features "
                         f"({'feature' if x_feature_major else 'sample'}-major)")


def saved_for_recompute(x: torch.Tensor, x_feature_major: bool, tiles: TileRouting, packed: Packed, shape: MLPShape,
                        *, input_padding: tuple[int, float] = (0, 0.0)) -> Saved:
    """What `forward(..., save=True, recompute=True)` returns for `backward`, without running the forward: for a
    caller that needs the gradients only (a training step whose loss the backward computes)."""
    _check_input(x, x_feature_major, shape.n_in - input_padding[0])
    _check_recomputes(shape)
    return Saved(x, x_feature_major, (input_padding[0], float(input_padding[1])), None, tiles, packed, shape, True)


def forward(x: torch.Tensor, x_feature_major: bool, tiles: TileRouting, packed: Packed, shape: MLPShape, *,
            save: bool = False, input_padding: tuple[int, float] = (0, 0.0), block_m: int | None = None,
            recompute: bool = False) -> tuple[torch.Tensor, Saved | None]:
    """(out, saved): out float32 (batch, n_out) in the caller's sample order; `saved` (with `save`) for backward.

    x: (batch, n_real) sample-major or (n_real, batch) feature-major (`x_feature_major`), any float dtype, any
    strides, n_real = shape.n_in - input_padding[0]: the kernels append tcnn's constant input columns
    (input_padding = (count, value)) themselves. tiles: the sort order and tiles of any size of one network each
    (tinn.routing.route_fused / route_bounded). shape: the computed shape (NetworkArray.shape, n_in with padding).
    """
    n_pad, pad_value = input_padding
    n_real_in = shape.n_in - n_pad
    _check_input(x, x_feature_major, n_real_in)
    batch = x.shape[1] if x_feature_major else x.shape[0]
    g = packed.geometry
    dev = x.device
    out = torch.empty(batch, shape.n_out, device=dev, dtype=torch.float32)
    hidden = shape.n_layers - 1
    if recompute:
        _check_recomputes(shape)
    keep = save and not recompute
    pre = (torch.empty(hidden, batch, g.h, device=dev, dtype=packed.weights.dtype) if keep and hidden else None)
    options = launch_options(g, packed.precision, dev, block_m, "forward" if keep else "inference")
    n_tiles = tiles.tile_net.shape[0]
    if batch and n_tiles:
        s_sample, s_feature = _feature_strides(x, x_feature_major)
        pre_arg = pre if pre is not None else out
        wide = _wide_offsets(batch, ((s_sample, s_feature), g.k0), ((out.stride(0), 1), g.o), ((g.h, 1), g.h))
        kernel = _kernel_for(mlp.forward_kernel, mlp.forward_kernel_any_batch, batch, s_sample, s_feature,
                             out.stride(0))
        kernel[(n_tiles,)](
            x, s_sample, s_feature, float(pad_value),
            packed.weights, packed.weights.stride(0),
            tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count,
            out, out.stride(0),
            pre_arg, pre.stride(0) if pre is not None else 0,
            SAVE=pre is not None, WIDE_OFFSETS=wide, IN_ORDER=tiles.in_order,
            **kernel_constants(shape, g, packed.precision, n_real_in, options))
    saved = Saved(x, x_feature_major, (n_pad, float(pad_value)), pre, tiles, packed, shape, recompute) if save \
        else None
    return out, saved


# Device copies of fixed gradient scales, one per (value, device): the kernels read the scale from memory.
_FIXED_SCALES: dict[tuple[float, torch.device], torch.Tensor] = {}


def _scale_tensor(scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The gradient scale as a float32 device tensor of one value: a scaler's own (read where it lives), or a
    cached copy of a fixed one."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or scale.dtype != torch.float32 or scale.device != device:
            raise ValueError(f"gradient_scale must be one float32 value on {device}; got {tuple(scale.shape)} "
                             f"{scale.dtype} on {scale.device}")
        return scale
    key = (float(scale), device)
    cached = _FIXED_SCALES.get(key)
    if cached is None:
        cached = runtime.keep(_FIXED_SCALES, key, torch.full((1,), float(scale), dtype=torch.float32, device=device))
    return cached


def backward_from_loss(loss_kind: int, target: torch.Tensor, saved: Saved, chunks: TileRouting | None = None, *,
                       want_dx: bool = True, want_params: bool = True,
                       gradient_scale: float | torch.Tensor | None = None, block_m: int | None = None,
                       mean_over: int | None = None, lift: float = 1.0, pieces=None
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """(dx, dparams, loss): `backward` of the mean loss `loss_kind` (a tinn.kernels.losses id, without a pdf)
    of the forward's output against `target` (batch, n_out), whose gradient the output layer computes from the
    prediction it recomputes: no dy is written or read. loss: the mean over the batch's elements (over
    `mean_over` elements where given: tinn.losses.Loss), a 0-d float32 device tensor (per-chunk sums added by
    torch, one launch). lift: a power of two the gradient scale is multiplied by (`gradient_scaling.mean_lift`:
    float16's deltas of a mean over many elements kept at a unit size), divided out of the results with it."""
    if loss_kind not in FUSED_LOSSES:
        raise ValueError(f"loss_kind={loss_kind!r}: the kernels compute losses {sorted(FUSED_LOSSES)}")
    n_chunks = (saved.tiles if chunks is None else chunks).tile_net.shape[0]
    parts = torch.zeros(max(n_chunks, 1), device=target.device, dtype=torch.float32)
    count = mean_over or max(target.numel(), 1)
    dx, dparams = backward(target, saved, chunks, want_dx=want_dx, want_params=want_params,
                           gradient_scale=gradient_scale, block_m=block_m, pieces=pieces,
                           _loss=(loss_kind, parts, 1.0 / count, lift))
    return dx, dparams, parts.sum() / count


# tinn.kernels.losses ids the kernels compute (mlp._loss_element; all of tcnn's losses, without a pdf)
FUSED_LOSSES = frozenset(range(9))


def backward(dy: torch.Tensor, saved: Saved, chunks: TileRouting | None = None, *, want_dx: bool = True,
             want_params: bool = True, gradient_scale: float | torch.Tensor | None = None,
             block_m: int | None = None, pieces=None, _loss: tuple[int, torch.Tensor, float, float] | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dx, dparams) from dy, the loss gradient of `forward`'s output (batch, n_out), any float dtype and strides.

    dx: float32 in x's layout and shape (the real input columns), or None without `want_dx`. dparams: float32
    (n_networks, row length) in tinn's flat layout, zero in tcnn's padded output rows and for networks without
    samples, or None without `want_params`. chunks: the backward's tiles (default: the forward's), any size, the
    same sort order; a program accumulates a chunk's weight gradients in registers, so larger chunks mean fewer
    atomic adds. gradient_scale (default 128 in float16, else 1; a float, or a one-value float32 tensor on the
    device, which the kernel reads there): dy is multiplied by it before it is cast to the compute dtype
    (float16's small gradients would underflow), and the float32 results divided by it. pieces (a
    tinn.gradient_pieces.GradientPieces; with `want_params`): the kernel is launched once per range of networks,
    and each range's rows of dparams handed over after its launch.
    """
    shape, packed, g = saved.shape, saved.packed, saved.packed.geometry
    chunks = saved.tiles if chunks is None else chunks
    x = saved.x
    batch = x.shape[1] if saved.x_feature_major else x.shape[0]
    if tuple(dy.shape) != (batch, shape.n_out):
        raise ValueError(f"dy has shape {tuple(dy.shape)}; expected {(batch, shape.n_out)}")
    dev = x.device
    # Every sample's real input columns are written (the chunks cover the batch): no zero fill.
    dx = (torch.empty if batch else torch.zeros)(x.shape, device=dev, dtype=torch.float32) if want_dx else None
    dparams = (torch.zeros(packed.weights.shape[0], packed.row_length, device=dev, dtype=torch.float32)
               if want_params else None)
    scale = _scale_tensor(DEFAULT_GRADIENT_SCALES[packed.precision] if gradient_scale is None else gradient_scale,
                          dev)
    n_chunks = chunks.tile_net.shape[0]
    if not batch or not n_chunks or not (want_dx or want_params):
        return dx, dparams
    recompute = saved.recompute
    hidden = shape.n_layers - 1
    if hidden and saved.pre is None and not recompute:
        raise ValueError("backward needs a forward run with save=True")
    dx_arg = dx if want_dx else dy
    dp_arg = dparams if want_params else dy
    s_x = _feature_strides(x, saved.x_feature_major)
    s_dx = _feature_strides(dx, saved.x_feature_major) if want_dx else (0, 0)
    s_dy = (dy.stride(0), dy.stride(1))
    operands = [(s_x, g.k0), (s_dx, g.k0), (s_dy, g.o)]
    if recompute:  # mlp.recompute_backward_kernel: the forward saved nothing
        kernels, name, saved_args = (mlp.recompute_backward_kernel, mlp.recompute_backward_kernel_any_batch), \
            "recompute", ()
    else:  # the saved pre-activations, and a scratch buffer of deltas by sorted position
        deltas = torch.empty(batch, g.h, device=dev, dtype=packed.weights.dtype) if hidden else dy
        pre = saved.pre if hidden else dy
        kernels, name, saved_args = (mlp.backward_kernel, mlp.backward_kernel_any_batch), "backward", \
            (pre, pre.stride(0) if hidden else 0, deltas)
        operands.append(((g.h, 1), g.h))
    kernel = _kernel_for(*kernels, batch, *s_x, *s_dx, *s_dy)
    options = launch_options(g, packed.precision, dev, block_m, f"{name}_dx" if want_dx else name)
    n_networks = packed.weights.shape[0]
    # Cut by network where a consumer asked for pieces: a program adds one chunk's weight gradients, all layers,
    # into its network's row, so a range's rows are final after its launch. Each launch covers every chunk and
    # skips the other ranges' (a load and a compare each).
    cut = pieces is not None and want_params and pieces.accepts(dparams)
    ranges = pieces.ranges(n_networks) if cut else [(0, n_networks)]
    for lo, hi in ranges:
        kernel[(n_chunks,)](
            x, *s_x, saved.input_padding[1],
            packed.weights, packed.weights.stride(0),
            chunks.order, chunks.tile_net, chunks.tile_start, chunks.tile_count,
            dy, *s_dy,
            *saved_args,
            dx_arg, *s_dx,
            dp_arg, dparams.stride(0) if want_params else 0,
            scale, 1.0 if _loss is None else _loss[3], 1.0 / max(dy.numel(), 1) if _loss is None else _loss[2],
            scale if _loss is None else _loss[1],
            lo, hi,
            WIDTH=shape.width, WANT_DX=want_dx, WANT_PARAMS=want_params, WIDE_OFFSETS=_wide_offsets(batch, *operands),
            LOSS=-1 if _loss is None else _loss[0], IN_ORDER=chunks.in_order,
            **kernel_constants(shape, g, packed.precision, shape.n_in - saved.input_padding[0], options))
        if len(ranges) > 1:
            pieces.hand_over(dparams, lo, hi)
    return dx, dparams

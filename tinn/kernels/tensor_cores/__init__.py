"""Tensor-core (Triton) kernels of an MLP array: N networks of one `MLPShape`, samples routed by network id.

Functional API (nothing here imports Triton until a kernel is needed; `available()` says whether it can):

    available() -> (bool, reason)
    supported(shape: MLPShape) -> bool
        any n_in and n_out in 1..128, hidden width 1..128, 0+ hidden layers, every activation code. Feature
        counts are padded to powers of two from 16 inside the kernels (Triton blocks).
    pack_weights(params, shape, precision, pad_output_to_hidden=True) -> Packed
        params: tinn's (N, P) float32 rows (layers row-major (fan_out, fan_in) back to back; P may include
        tcnn's padded output rows). Packed.weights: (N, packed size) in the compute dtype, each layer
        transposed and zero-padded (1 + n_layers torch ops). Repack after every optimizer step.
        pad_output_to_hidden: the last layer's block at least as wide as the hidden one (geometry.py: a
        workaround of a GPU miscompilation seen in a prototype; False is narrower and faster where it holds).
    forward(x, x_feature_major, tiles, packed, shape, *, save=False, input_padding=(0, 0.0), block_m=None)
        -> (out, saved)
        x: (batch, n_real) or feature-major (n_real, batch), n_real = shape.n_in - input_padding[0] (the kernels
        append tcnn's constant input columns). tiles: tinn.routing.TileRouting (sort order + tiles of any size of
        one network; count 0 = padding tile). out: float32 (batch, n_out) in the caller's sample order.
        saved (save=True): x, the hidden pre-activations in the compute dtype by sorted position, tiles, packed.
    backward(dy, saved, chunks=None, *, want_dx=True, want_params=True, gradient_scale=None, block_m=None)
        -> (dx or None, dparams or None)
        dx: float32 in x's layout; dparams: float32 (N, P) in tinn's layout, zero in tcnn's padded rows.
        chunks: the backward's tiles (any size, the same sort order as the forward's tiles, e.g. both from one
        route_fused(ids, N, (tile, chunk)); default the forward's tiles). A chunk's weight gradients add up in
        registers and reach dparams in one atomic add per layer. gradient_scale: dy's multiplier before the cast
        to the compute dtype (default 128 for float16, else 1), divided out of the float32 results: a float, or
        a one-value float32 device tensor (a dynamic scaler's), which the kernel reads on the device.
    backward_from_loss(loss_kind, target, saved, chunks=None, *, want_dx=True, want_params=True,
                       gradient_scale=None, block_m=None) -> (dx or None, dparams or None, mean loss)
        the same with dy computed inside the output layer from the recomputed prediction and `target`: the mean
        of tinn loss `loss_kind` (any of tcnn's, no pdf) over the batch's elements; no dy pass.
    block_m: samples a program multiplies at once (launch.launch_options picks it: 128 or 64 on the GPU, 16
        under the interpreter).

Saved for the backward: each hidden layer's pre-activation in the compute dtype by sorted position,
(hidden layers, batch, H); the backward recomputes activations from it (and the output layer's pre-activation
from the last hidden activation), and keeps one (batch, H) scratch buffer of deltas.

Precisions: "float32" (exact IEEE float32 products), "tf32" (float32 operands on TF32 tensor cores),
"float16" and "bfloat16" (16-bit operands); products always accumulate in float32, activations in float32.
"""
from __future__ import annotations

from .geometry import DEFAULT_GRADIENT_SCALES, MAX_FEATURES, MAX_WIDTH, PRECISIONS, Geometry, supported

_LAUNCH_NAMES = ("pack_weights", "forward", "backward", "backward_from_loss", "FUSED_LOSSES", "recomputes", "saved_for_recompute", "Packed", "Saved", "COMPUTE_DTYPES", "default_block_m")


def available() -> tuple[bool, str]:
    """(whether Triton imports here, why not)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as e:  # an ImportError, or a broken install raising anything else
        return False, f"triton is not importable: {type(e).__name__}: {e}"
    return True, ""


def __getattr__(name):
    # The launchers import Triton; load them on first use only.
    if name in _LAUNCH_NAMES:
        from . import launch
        return getattr(launch, name)
    raise AttributeError(name)


__all__ = ["available", "supported", "Geometry", "PRECISIONS", "MAX_WIDTH", "MAX_FEATURES",
           "DEFAULT_GRADIENT_SCALES", *_LAUNCH_NAMES]

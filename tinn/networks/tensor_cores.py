"""The tensor-core path of an MLP array: Triton kernels on CUDA (`tinn/kernels/tensor_cores/`).

Routing: one sort, then forward tiles of one network's samples and longer chunks for the backward (whose
programs add a chunk's weight gradients once), each list built by one kernel (tinn/kernels/tensor_cores/tiles.py).
The kernels read the array's float32 parameters through a copy packed per call in the compute precision
(transposed, padded to the tensor cores' shapes), and write float32 outputs, input gradients and weight gradients
in tinn's layouts, so the rest of tinn (grids, losses, optimizers, checkpoints) sees the same tensors as on every
other path. tcnn's constant input columns are appended inside the kernels (no padded copy of the input).
"""
from __future__ import annotations

import functools
import math

import torch

from .. import gradient_pieces, runtime
from ..kernels import triton_interpreted
from ..routing import sorted_bounds, sorts_to_identity

# The backward recomputes the forward up to this hidden width (its weight gradients in registers; at 128, 32
# samples a block and 8 warps keep them there); wider layers save their pre-activations and go layer by layer.
RECOMPUTE_MAX_WIDTH = 128

# Backward chunks: long enough that a network's weight-gradient atomics are rare, short enough that a small
# batch still spreads over every SM. A single network's chunks all add into the same weights: about this many
# programs per SM (a power of two of samples each, at most MAX_SINGLE_CHUNK), no more.
MIN_CHUNK, MAX_CHUNK = 256, 2048
SINGLE_CHUNKS_PER_SM, MAX_SINGLE_CHUNK = 2, 16384


def _kernels():
    from ..kernels import tensor_cores
    return tensor_cores


def unavailable_reason(arch: str, shape) -> str | None:
    """None where the tensor-core kernels can run an array of this shape here, else why not (for messages).
    On the CPU they run only in Triton's interpreter (tests at toy sizes), and are never chosen by default."""
    if arch != "cuda" and not triton_interpreted():
        return "the tensor-core kernels need the CUDA arch"
    kernels = _kernels()
    ok, reason = kernels.available()
    if not ok:
        return reason
    if shape is not None and not kernels.supported(shape):
        return (f"the tensor-core kernels take hidden widths up to {kernels.MAX_WIDTH} and at most "
                f"{kernels.MAX_FEATURES} inputs or outputs")
    return None


# Inference tiles: a program takes up to this many samples of one network, block after block, so that it loads
# the first and last layers' weights once for them and its next block's loads overlap this block's products;
# shorter where the batch would then not spread over the GPU (about 4096 programs).
MAX_INFERENCE_TILE = 1024
INFERENCE_PROGRAMS = 4096


def inference_tile(batch: int, block: int) -> int:
    """Samples per inference tile: a multiple of the kernel's `block`, at most MAX_INFERENCE_TILE."""
    return max(block, min(MAX_INFERENCE_TILE, batch // INFERENCE_PROGRAMS) // block * block)


def chunk_size(batch: int, tile: int, n_networks: int = 2, sms: int = 132) -> int:
    """Samples per backward chunk, a multiple of the forward's tile; `sms`: the GPU's multiprocessors."""
    if n_networks == 1:
        per_program = batch / (SINGLE_CHUNKS_PER_SM * sms)
        want = min(MAX_SINGLE_CHUNK, max(MIN_CHUNK, 1 << max(0, round(math.log2(max(per_program, 1.0))))))
    else:
        want = min(MAX_CHUNK, max(MIN_CHUNK, batch // 1024))
    return max(tile, want // tile * tile)


@functools.lru_cache(maxsize=None)
def multiprocessors(device: torch.device) -> int:
    """The device's SM count (an H100's where there is none: the interpreter's tests size chunks alike); asked once
    per device, as every array's training step builds its chunks."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


class TensorCorePath:
    """Forward, inference and backward of one array on the tensor-core kernels."""

    def __init__(self, shape, n_networks: int, precision: str, input_padding: tuple[int, float]):
        self.shape, self.n_networks, self.precision = shape, n_networks, precision
        self.input_padding = input_padding
        self.kernels = _kernels()
        self._single_routing: dict = {}  # one network: (batch, device, train) -> its tile lists

    def _routing(self, ids: torch.Tensor, device: torch.device, train: bool):
        if self.n_networks == 1:
            # One network's tiles depend on the batch size alone: built once per size, not per call (each
            # build is a sort stand-in, a memset and a launch per list, host time a small step notices). Kept per
            # stream: lists dropped from the cache may be reused by the allocator only after the work of the
            # stream that made them, which must then be the only stream that read them.
            stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
            key = (ids.shape[0], device, stream, train)
            kept = self._single_routing.get(key)
            if kept is None:
                if len(self._single_routing) >= 4:  # a few batch sizes in turn (training, evaluation)
                    self._single_routing.clear()
                kept = runtime.keep(self._single_routing, key, self._build_routing(ids, device, train))
            return kept
        return self._build_routing(ids, device, train)

    def _build_routing(self, ids: torch.Tensor, device: torch.device, train: bool):
        from ..kernels.tensor_cores import tiles
        tile = self.kernels.default_block_m(device)
        batch = ids.shape[0]
        sizes = ((tile, chunk_size(batch, tile, self.n_networks, multiprocessors(device))) if train
                 else (inference_tile(batch, tile),))
        order, bounds = sorted_bounds(ids, self.n_networks)
        return tiles.tile_lists(order, bounds, batch, sizes, triton_interpreted(),
                                sorts_to_identity(ids, self.n_networks))

    def inference(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor,
                  x_feature_major: bool) -> torch.Tensor:
        packed = self.kernels.pack_weights(params, self.shape, self.precision)
        (tiles,) = self._routing(ids, x.device, train=False)
        out, _ = self.kernels.forward(x, x_feature_major, tiles, packed, self.shape, save=False,
                                      input_padding=self.input_padding)
        return out

    def recomputes(self) -> bool:
        """Whether the backward recomputes the forward (the training forward then saves no activations): for
        the depths whose weight gradients fit one program's registers, hidden layers up to RECOMPUTE_MAX_WIDTH,
        unless `tuning.tensor_core_recompute` is off."""
        return (runtime.tuning().tensor_core_recompute and self.kernels.recomputes(self.shape)
                and self.shape.width <= RECOMPUTE_MAX_WIDTH)

    def forward_train(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, x_feature_major: bool):
        """(out, saved): what the backward needs stays in `saved`."""
        packed = self.kernels.pack_weights(params, self.shape, self.precision)
        tiles, chunks = self._routing(ids, x.device, train=True)
        out, saved = self.kernels.forward(x, x_feature_major, tiles, packed, self.shape, save=True,
                                          input_padding=self.input_padding, recompute=self.recomputes())
        return out, (saved, chunks)

    def saved_without_forward(self, x: torch.Tensor, ids: torch.Tensor, params: torch.Tensor, x_feature_major: bool):
        """What `backward` needs when it recomputes the forward (`recomputes()`): the routing and the packed
        weights, without running the forward."""
        packed = self.kernels.pack_weights(params, self.shape, self.precision)
        tiles, chunks = self._routing(ids, x.device, train=True)
        return self.kernels.saved_for_recompute(x, x_feature_major, tiles, packed, self.shape,
                                                input_padding=self.input_padding), chunks

    def backward(self, saved, dy: torch.Tensor, want_dx: bool, want_params: bool,
                 gradient_scale: float | torch.Tensor):
        """(dx in x's layout or None, float32 dparams (N, P) or None); dparams handed over range by range where
        the caller asked for pieces (tinn/gradient_pieces.py)."""
        forward_saved, chunks = saved
        return self.kernels.backward(dy, forward_saved, chunks, want_dx=want_dx, want_params=want_params,
                                     gradient_scale=gradient_scale, pieces=gradient_pieces.current())

    def backward_from_loss(self, saved, loss_kind: int, target: torch.Tensor, want_dx: bool, want_params: bool,
                           gradient_scale: float | torch.Tensor, mean_over: int | None = None, lift: float = 1.0):
        """(dx or None, dparams or None, mean loss): the backward of tinn loss `loss_kind` against `target`, its
        gradient taken inside the output layer's kernel; the mean over `mean_over` elements where given
        (tinn.losses.Loss), else over the batch's; `lift` multiplies the gradient scale (launch.backward_from_loss)."""
        forward_saved, chunks = saved
        return self.kernels.backward_from_loss(loss_kind, target, forward_saved, chunks, want_dx=want_dx,
                                               want_params=want_params, gradient_scale=gradient_scale,
                                               mean_over=mean_over, lift=lift, pieces=gradient_pieces.current())

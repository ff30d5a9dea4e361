"""Padded block sizes and offsets of the tensor-core MLP kernels (plain Python: no Triton needed).

Triton's block dimensions are powers of two and `tl.dot` needs every dimension at least 16, so each
feature count is padded to the next power of two from 16 (zero weight rows and columns, masked loads
and stores). The last layer's output block is padded to at least the hidden block: a chained dot whose
last layer was narrower than the layer before it computed wrong numbers on the GPU.
"""
from __future__ import annotations

from typing import NamedTuple

from ..mlp_array import MLPShape, layer_shapes

PRECISIONS = ("float32", "tf32", "float16", "bfloat16")
MAX_WIDTH = 128      # hidden width: a (BM, width) block and a (width, width) weight per program
MAX_FEATURES = 256   # inputs and outputs: larger blocks would spill registers
MIN_BLOCK = 16       # tl.dot's smallest dimension
# Loss scale of float16's deltas (backward's default `gradient_scale`): keeps small gradients above
# float16's subnormals; the kernels divide it out of the float32 results.
DEFAULT_GRADIENT_SCALES = {"float32": 1.0, "tf32": 1.0, "float16": 128.0, "bfloat16": 1.0}


def block(n: int) -> int:
    """The power-of-two block (at least MIN_BLOCK) that holds n features."""
    return max(MIN_BLOCK, 1 << (n - 1).bit_length())


def supported(shape: MLPShape) -> bool:
    """Whether the tensor-core kernels take this shape (any activation codes 0..9)."""
    return (1 <= shape.n_in <= MAX_FEATURES and 1 <= shape.n_out <= MAX_FEATURES and shape.n_layers >= 1
            and (shape.n_layers == 1 or 1 <= shape.width <= MAX_WIDTH)
            and 0 <= shape.hidden_act <= 9 and 0 <= shape.output_act <= 9)


class Geometry(NamedTuple):
    """Blocks of one shape: K0 (inputs), H (hidden), O (outputs), and per layer the (fan_in block, fan_out block)
    of its transposed weight in the packed buffer, that block's offset there, its real (fan_out, fan_in) and its
    offset in tinn's flat parameter row."""
    k0: int
    h: int
    o: int
    blocks: tuple[tuple[int, int], ...]
    packed_offsets: tuple[int, ...]
    packed_size: int
    fans: tuple[tuple[int, int], ...]
    param_offsets: tuple[int, ...]

    @staticmethod
    def of(shape: MLPShape) -> "Geometry":
        n_layers = shape.n_layers
        k0 = block(shape.n_in)
        h = block(shape.width) if n_layers > 1 else 0
        o = max(block(shape.n_out), h)
        dims = [k0] + [h] * (n_layers - 1) + [o]
        blocks = tuple((dims[l], dims[l + 1]) for l in range(n_layers))
        packed, off = [], 0
        for kin, kout in blocks:
            packed.append(off)
            off += kin * kout
        fans = tuple(layer_shapes(shape.n_in, shape.width, shape.n_out, n_layers))
        params, p = [], 0
        for fan_out, fan_in in fans:
            params.append(p)
            p += fan_out * fan_in
        return Geometry(k0, h, o, blocks, tuple(packed), off, fans, tuple(params))

"""The image task's batch sampler (`image_sampling.sample_image_batch`, Taichi) as one Triton launch on CUDA: the same
hash stream, routing and bilinear lookup, so xy, local coordinates and tile ids are bit for bit the Taichi kernel's,
and the targets agree up to the last bit (FMA contraction). Imported only where Triton runs (CUDA, or its CPU
interpreter in tests).

Why: the image task draws a batch every step, and a Taichi launch costs the host several times a Triton launch and
runs on Taichi's stream, which the step's torch stream then waits for (design notes, "A step's bookkeeping as Triton
launches")."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 256  # samples a program draws (a few per thread: the hashes and lookups keep many registers)

INV_2_24 = tl.constexpr(1.0 / 16777216.0)  # 24 random bits -> [0, 1), as the Taichi kernel


@triton.jit
def _pcg_hash(v):
    """`image_sampling.pcg_hash` on uint32 (a bijection; the arithmetic wraps)."""
    state = v * tl.full((), 747796405, tl.uint32) + tl.full((), 2891336453, tl.uint32)
    shift = (state >> tl.full((), 28, tl.uint32)) + tl.full((), 4, tl.uint32)
    word = ((state >> shift) ^ state) * tl.full((), 277803737, tl.uint32)
    return (word >> tl.full((), 22, tl.uint32)) ^ word


@triton.jit
def _scaled(bits, n):
    """(bits * 2^-24) * n rounded once to float32, as the Taichi kernel's integer product."""
    return (bits.to(tl.int64) * n).to(tl.float32) * INV_2_24


# No argument specialised: an image one pixel wide or a single tile must not turn a size into a constant.
@triton.jit(do_not_specialize=["seed", "step", "n", "height", "width", "channels", "tiles"])
def _sample_kernel(image_ptr, local_ptr, target_ptr, ids_ptr, xy_ptr, seed, step, n, height, width, channels, tiles,
                   WRITE_XY: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    key = _pcg_hash(_pcg_hash(seed.to(tl.uint32, bitcast=True)) ^ step.to(tl.uint32, bitcast=True))
    counter = i.to(tl.uint32) * tl.full((), 2, tl.uint32)
    eight = tl.full((), 8, tl.uint32)
    bx = _pcg_hash(key ^ _pcg_hash(counter)) >> eight
    by = _pcg_hash(key ^ _pcg_hash(counter + tl.full((), 1, tl.uint32))) >> eight
    x = bx.to(tl.int32).to(tl.float32) * INV_2_24
    y = by.to(tl.int32).to(tl.float32) * INV_2_24
    i64 = i.to(tl.int64)
    if WRITE_XY:
        tl.store(xy_ptr + 2 * i64, x, mask=live)
        tl.store(xy_ptr + 2 * i64 + 1, y, mask=live)
    if tiles == 1:
        tl.store(local_ptr + 2 * i64, x, mask=live)
        tl.store(local_ptr + 2 * i64 + 1, y, mask=live)
        tl.store(ids_ptr + i64, i * 0, mask=live)
    else:
        sx = _scaled(bx, tiles)
        sy = _scaled(by, tiles)
        top_cell = (tiles - 1).to(tl.float32)
        cx = tl.minimum(tl.maximum(tl.floor(sx), 0.0), top_cell)
        cy = tl.minimum(tl.maximum(tl.floor(sy), 0.0), top_cell)
        tl.store(local_ptr + 2 * i64, sx - cx, mask=live)
        tl.store(local_ptr + 2 * i64 + 1, sy - cy, mask=live)
        tl.store(ids_ptr + i64, cy.to(tl.int32) * tiles + cx.to(tl.int32), mask=live)
    # Bilinear lookup, pixel centres at (j + 0.5) / W.
    px = tl.minimum(tl.maximum(_scaled(bx, width) - 0.5, 0.0), (width - 1).to(tl.float32))
    py = tl.minimum(tl.maximum(_scaled(by, height) - 0.5, 0.0), (height - 1).to(tl.float32))
    x0 = tl.floor(px).to(tl.int32)
    y0 = tl.floor(py).to(tl.int32)
    if width > 1:
        x0 = tl.minimum(x0, width - 2)
    if height > 1:
        y0 = tl.minimum(y0, height - 2)
    x1 = tl.minimum(x0 + 1, width - 1)
    y1 = tl.minimum(y0 + 1, height - 1)
    fx = px - x0.to(tl.float32)
    fy = py - y0.to(tl.float32)
    row0 = y0.to(tl.int64) * width
    row1 = y1.to(tl.int64) * width
    for c in range(channels):
        v00 = tl.load(image_ptr + (row0 + x0) * channels + c, mask=live, other=0.0)
        v01 = tl.load(image_ptr + (row0 + x1) * channels + c, mask=live, other=0.0)
        v10 = tl.load(image_ptr + (row1 + x0) * channels + c, mask=live, other=0.0)
        v11 = tl.load(image_ptr + (row1 + x1) * channels + c, mask=live, other=0.0)
        top = v00 * (1.0 - fx) + v01 * fx
        bottom = v10 * (1.0 - fx) + v11 * fx
        tl.store(target_ptr + i64 * channels + c, top * (1.0 - fy) + bottom * fy, mask=live)


def sample_image_batch(image: torch.Tensor, seed: int, step: int, tiles: int, local: torch.Tensor,
                       target: torch.Tensor, ids: torch.Tensor, xy: torch.Tensor, write_xy: int) -> None:
    """`image_sampling.sample_image_batch` with the same arguments (contiguous tensors on one device)."""
    n = ids.shape[0]
    if n == 0:
        return
    height, width, channels = image.shape
    _sample_kernel[(triton.cdiv(n, BLOCK),)](image, local, target, ids, xy, seed, step, n, height, width, channels,
                                              tiles, WRITE_XY=bool(write_xy), BLOCK=BLOCK)

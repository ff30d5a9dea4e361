"""Random training batches for the image task in one kernel launch.

One thread per sample draws xy in [0,1)^2, routes it to its tile and looks the
image up bilinearly, replacing ~20 small torch ops (host time that dominated a GPU
step). The random numbers come from a stateless counter-based hash of
(seed, step, sample, component): no RNG state to keep, and the stream for a given
seed is the same on every backend. xy, the local coordinates and the tile ids are
bitwise identical on CPU and CUDA (integer hashing, exact integer-to-float
conversions); the bilinear targets may differ in the last bit (FMA contraction). On CUDA the same batch is
drawn by one Triton launch (`image_sampling_triton.py`, `tuning.triton_step_kernels`); this kernel is the CPU's
and the reference its tests compare with.
"""
from ..backend import ti

from .launch import fast_kernel

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
f32_3d = ti.types.ndarray(dtype=ti.f32, ndim=3)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)

INV_2_24 = 1.0 / 16777216.0  # 24 random bits -> [0, 1), exactly representable steps


@ti.func
def pcg_hash(v: ti.u32) -> ti.u32:
    """A PCG-style 32-bit integer hash (a bijection on u32; u32 arithmetic wraps)."""
    state = v * ti.u32(747796405) + ti.u32(2891336453)
    word = (ti.bit_shr(state, ti.bit_shr(state, ti.u32(28)) + ti.u32(4)) ^ state) * ti.u32(277803737)
    return ti.bit_shr(word, ti.u32(22)) ^ word


@ti.func
def _scaled(bits: ti.u32, n: ti.i32) -> ti.f32:
    """(bits * 2^-24) * n rounded to f32 as torch's `xy * n` would, computed as an integer product
    rounded once, so the compiler cannot fuse it differently (bits < 2^24)."""
    return ti.cast(ti.cast(bits, ti.i64) * ti.cast(n, ti.i64), ti.f32) * INV_2_24


@fast_kernel
@ti.kernel
def sample_image_batch(image: f32_3d, seed: ti.i32, step: ti.i32, tiles: ti.i32, local: f32_2d, target: f32_2d,
                       ids: i32_1d, xy: f32_2d, write_xy: ti.i32):
    """Sample i of batch `step`: xy = 24 high bits of hash(seed, step, 2i + component) / 2^24;
    local/ids as `ImageTask.route`, target as `ImageTask.lookup` on the (H, W, C) image; xy written if asked."""
    height = image.shape[0]
    width = image.shape[1]
    channels = image.shape[2]
    for i in range(ids.shape[0]):
        key = pcg_hash(pcg_hash(ti.cast(seed, ti.u32)) ^ ti.cast(step, ti.u32))
        counter = ti.cast(i, ti.u32) * ti.u32(2)
        bx = ti.bit_shr(pcg_hash(key ^ pcg_hash(counter)), ti.u32(8))
        by = ti.bit_shr(pcg_hash(key ^ pcg_hash(counter + ti.u32(1))), ti.u32(8))
        x = ti.cast(ti.cast(bx, ti.i32), ti.f32) * INV_2_24
        y = ti.cast(ti.cast(by, ti.i32), ti.f32) * INV_2_24
        if write_xy != 0:
            xy[i, 0] = x
            xy[i, 1] = y

        # Routing: tile (cell) and coordinates local to it.
        if tiles == 1:
            local[i, 0] = x
            local[i, 1] = y
            ids[i] = 0
        else:
            sx = _scaled(bx, tiles)
            sy = _scaled(by, tiles)
            top_cell = ti.cast(tiles - 1, ti.f32)
            cx = ti.math.clamp(ti.floor(sx), 0.0, top_cell)
            cy = ti.math.clamp(ti.floor(sy), 0.0, top_cell)
            local[i, 0] = sx - cx
            local[i, 1] = sy - cy
            ids[i] = ti.cast(cy, ti.i32) * tiles + ti.cast(cx, ti.i32)

        # Bilinear lookup, pixel centres at (j + 0.5) / W.
        px = ti.math.clamp(_scaled(bx, width) - 0.5, 0.0, ti.cast(width - 1, ti.f32))
        py = ti.math.clamp(_scaled(by, height) - 0.5, 0.0, ti.cast(height - 1, ti.f32))
        x0 = ti.cast(ti.floor(px), ti.i32)
        y0 = ti.cast(ti.floor(py), ti.i32)
        if width > 1:
            x0 = ti.min(x0, width - 2)
        if height > 1:
            y0 = ti.min(y0, height - 2)
        x1 = ti.min(x0 + 1, width - 1)
        y1 = ti.min(y0 + 1, height - 1)
        fx = px - ti.cast(x0, ti.f32)
        fy = py - ti.cast(y0, ti.f32)
        for c in range(channels):
            top = image[y0, x0, c] * (1.0 - fx) + image[y0, x1, c] * fx
            bottom = image[y1, x0, c] * (1.0 - fx) + image[y1, x1, c] * fx
            target[i, c] = top * (1.0 - fy) + bottom * fy

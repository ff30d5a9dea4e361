"""Ray marching for rendering: the samples of a run of each ray that fall in occupied voxels, packed.

A ray r spans [t_near[r], t_far[r]] inside the scene box, cut into `n_samples` equal bins with one sample at
each bin's midpoint (`tinn.render.stratified_t` without jitter, the same float32 arithmetic). A sample is
kept where it lies in the occupancy grid's box and its voxel is occupied (`OccupancyGrid.query`, the same
formulas); with `occ_res = 0` every sample of a ray that meets the box is kept.

A ray whose transmittance trans[r] is at most `cutoff` is finished (early ray termination) and keeps none.
Two passes over the same loop, so that nothing of size rays x samples is ever stored: `march_count` counts
the kept samples of each listed ray in bins [s0, s1), the caller turns the counts into offsets (a prefix
sum), and `march_emit` writes each kept sample's point and bin length at its ray's offset, front to back.

`box` (f32, 9): the occupancy grid's box_min (3), box_max (3) and voxel size (3).
"""
from ..backend import ti
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
u8_1d = ti.types.ndarray(dtype=ti.u8, ndim=1)


@ti.func
def bin_step(t_near: ti.template(), t_far: ti.template(), r, n_samples: ti.i32) -> ti.f32:
    """Bin length of ray r: its span in the box over n_samples (0 for a ray that misses)."""
    return ti.max(t_far[r] - t_near[r], 0.0) / ti.cast(n_samples, ti.f32)


@ti.func
def bin_point(origins: ti.template(), directions: ti.template(), t_near: ti.template(), r, s, step: ti.f32):
    """(t, x, y, z) of bin s's midpoint on ray r, in `stratified_t`'s float32 operations."""
    tt = t_near[r] + (ti.cast(s, ti.f32) + 0.5) * step
    return tt, origins[r, 0] + tt * directions[r, 0], origins[r, 1] + tt * directions[r, 1], \
        origins[r, 2] + tt * directions[r, 2]


@ti.func
def _kept(box: ti.template(), occupied: ti.template(), occ_res: ti.i32, px: ti.f32, py: ti.f32,
          pz: ti.f32) -> ti.i32:
    keep = 1
    if occ_res > 0:
        keep = 0  # a conjunction, so that NaN coordinates are never kept
        if px >= box[0] and px <= box[3] and py >= box[1] and py <= box[4] and pz >= box[2] and pz <= box[5]:
            top = ti.cast(occ_res - 1, ti.f32)
            vx = ti.cast(ti.min(ti.max(ti.floor((px - box[0]) / box[6]), 0.0), top), ti.i32)
            vy = ti.cast(ti.min(ti.max(ti.floor((py - box[1]) / box[7]), 0.0), top), ti.i32)
            vz = ti.cast(ti.min(ti.max(ti.floor((pz - box[2]) / box[8]), 0.0), top), ti.i32)
            keep = ti.cast(occupied[(vx * occ_res + vy) * occ_res + vz], ti.i32)
    return keep


@fast_kernel
@ti.kernel
def march_count(origins: f32_2d, directions: f32_2d, t_near: f32_1d, t_far: f32_1d, trans: f32_1d, cutoff: ti.f32,
                rays: i32_1d, s0: ti.i32, s1: ti.i32, n_samples: ti.i32, box: f32_1d, occupied: u8_1d,
                occ_res: ti.i32, counts: i32_1d):
    """counts[k]: kept samples of ray rays[k] among bins s0..s1-1."""
    for k in range(rays.shape[0]):
        r = rays[k]
        step = bin_step(t_near, t_far, r, n_samples)
        c = 0
        if step > 0.0 and trans[r] > cutoff:
            for s in range(s0, s1):
                _, px, py, pz = bin_point(origins, directions, t_near, r, s, step)
                c += _kept(box, occupied, occ_res, px, py, pz)
        counts[k] = c


@fast_kernel
@ti.kernel
def march_emit(origins: f32_2d, directions: f32_2d, t_near: f32_1d, t_far: f32_1d, trans: f32_1d, cutoff: ti.f32,
               rays: i32_1d, s0: ti.i32, s1: ti.i32, n_samples: ti.i32, box: f32_1d, occupied: u8_1d,
               occ_res: ti.i32, offsets: i32_1d, points: f32_2d, deltas: f32_1d):
    """points[offsets[k] + j], deltas[...]: the j-th kept sample of ray rays[k] (bins s0..s1-1, front to back)."""
    for k in range(rays.shape[0]):
        r = rays[k]
        step = bin_step(t_near, t_far, r, n_samples)
        row = offsets[k]
        if step > 0.0 and trans[r] > cutoff:
            for s in range(s0, s1):
                _, px, py, pz = bin_point(origins, directions, t_near, r, s, step)
                if _kept(box, occupied, occ_res, px, py, pz):
                    points[row, 0] = px
                    points[row, 1] = py
                    points[row, 2] = pz
                    deltas[row] = step
                    row += 1

"""KiloNeRF cell coordinates, one thread per point (`tinn.scenes.fields.kilonerf.cell_of` in one pass).

The box [box_min, box_max] is cut into grid^3 cells of size cell = (box_max - box_min) / grid. A point's cell is
q = clamp(floor((p - box_min) / cell), 0, grid - 1) per axis, its id (qx * grid + qy) * grid + qz, its local
coordinates clamp(((p - box_min) / cell - q) * 2 - 1, -1, 1) times `scale`, and `inside` says whether it lies
in the box (faces included). The same float32 operations as the torch version: on the CPU both agree bit
for bit; on CUDA, fast math may round the local coordinates differently in the last bit.

`box` (f32, 9): box_min (3), box_max (3), cell size (3).
"""
from ..backend import ti
from .launch import fast_kernel

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
u8_1d = ti.types.ndarray(dtype=ti.u8, ndim=1)


@fast_kernel
@ti.kernel
def cell_coords(points: f32_2d, box: f32_1d, grid: ti.i32, scale: ti.f32, ids: i32_1d, local: f32_2d,
                inside: u8_1d):
    top = ti.cast(grid - 1, ti.f32)
    for i in range(points.shape[0]):
        within = 1
        cell = 0
        for a in ti.static(range(3)):
            p = points[i, a]
            if not (p >= box[a] and p <= box[3 + a]):  # NaN fails both comparisons: outside
                within = 0
            scaled = (p - box[a]) / box[6 + a]
            q = ti.min(ti.max(ti.floor(scaled), 0.0), top)
            local[i, a] = ti.min(ti.max((scaled - q) * 2.0 - 1.0, -1.0), 1.0) * scale
            cell = cell * grid + ti.cast(q, ti.i32)
        ids[i] = cell
        inside[i] = ti.cast(within, ti.u8)

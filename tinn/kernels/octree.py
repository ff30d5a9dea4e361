"""Octree node lookup and level-of-detail sample assignment, one thread per sample.

The octree is flat (`tinn.scenes.acceleration.octree.Octree`): `children[n, slot]` is the child of node n in octant
`slot = bx + 2 by + 4 bz` (-1 where pruned), `split[n]` says whether n has any child. A point's octant at
depth d is read from the bits of its integer cell on the 2^max_depth grid over the root cube (the same
cell the builder sorted points by), so the walk from the root is a loop of `deepest` table reads.

`geo` (f32, GEO_SIZE) carries the fixed geometry: box_min, box_max, root_min (3 each), the cell scale
2^max_depth / edge, then the occupancy grid's corner and inverse voxel size (3 each).

The level rule is exact in float64: a sample of footprint radius r may descend to level L + 1 while
r * 2^(L+1) <= root_size, i.e. L = floor(log2(root_size / r)) without rounding a logarithm.
"""
from ..backend import ti
from .launch import fast_kernel
from .march import bin_point, bin_step

f32_1d = ti.types.ndarray(dtype=ti.f32, ndim=1)
f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)
i32_2d = ti.types.ndarray(dtype=ti.i32, ndim=2)
u8_1d = ti.types.ndarray(dtype=ti.u8, ndim=1)

GEO_BOX_MIN, GEO_BOX_MAX, GEO_ROOT_MIN, GEO_CELL_SCALE, GEO_OCC_MIN, GEO_OCC_INV_VOXEL = 0, 3, 6, 9, 10, 13
GEO_SIZE = 16


@ti.func
def _inside(geo: ti.template(), px: ti.f32, py: ti.f32, pz: ti.f32) -> ti.i32:
    inside = 0  # written as a conjunction so that NaN coordinates are outside
    if px >= geo[GEO_BOX_MIN] and px <= geo[GEO_BOX_MAX] and py >= geo[GEO_BOX_MIN + 1] \
            and py <= geo[GEO_BOX_MAX + 1] and pz >= geo[GEO_BOX_MIN + 2] and pz <= geo[GEO_BOX_MAX + 2]:
        inside = 1
    return inside


@ti.func
def _cell(geo: ti.template(), p: ti.f32, axis: ti.i32, cells: ti.i32) -> ti.i32:
    q = ti.floor((p - geo[GEO_ROOT_MIN + axis]) * geo[GEO_CELL_SCALE])
    return ti.cast(ti.min(ti.max(q, 0.0), ti.cast(cells - 1, ti.f32)), ti.i32)


@ti.func
def _descend(children: ti.template(), split: ti.template(), geo: ti.template(), px: ti.f32, py: ti.f32,
             pz: ti.f32, level: ti.i32, max_depth: ti.i32, deepest: ti.i32) -> ti.i32:
    """The node at depth `level` containing p, clamped to the leaf on the way; -1 outside the box or where the
    walk needs a pruned child."""
    node = -1
    if _inside(geo, px, py, pz) != 0:
        node = 0
        cells = 1 << max_depth
        qx, qy, qz = _cell(geo, px, 0, cells), _cell(geo, py, 1, cells), _cell(geo, pz, 2, cells)
        for d in range(deepest):
            if node >= 0 and level > d and split[node] != 0:
                bit = max_depth - 1 - d
                slot = ((qx >> bit) & 1) | (((qy >> bit) & 1) << 1) | (((qz >> bit) & 1) << 2)
                node = children[node, slot]
    return node


@ti.func
def _level(radius: ti.f32, root_size: ti.f64, deepest: ti.i32) -> ti.i32:
    r = ti.cast(radius, ti.f64)
    level = 0
    scale = ti.cast(2.0, ti.f64)
    for d in range(deepest):
        if level == d and r * scale <= root_size:
            level = d + 1
        scale *= 2.0
    return level


@fast_kernel
@ti.kernel
def lookup(points: f32_2d, levels: i32_1d, children: i32_2d, split: i32_1d, geo: f32_1d, max_depth: ti.i32,
           deepest: ti.i32, out_node: i32_1d):
    """Node of each point at its requested level (`Octree.lookup`)."""
    for i in range(points.shape[0]):
        out_node[i] = _descend(children, split, geo, points[i, 0], points[i, 1], points[i, 2], levels[i],
                               max_depth, deepest)


@fast_kernel
@ti.kernel
def assign_samples(origins: f32_2d, directions: f32_2d, t: f32_2d, deltas: f32_2d, radius: f32_1d,
                   children: i32_2d, split: i32_1d, node_depth: i32_1d, center: f32_2d, half: f32_1d, geo: f32_1d,
                   root_size: ti.f64, max_depth: ti.i32, deepest: ti.i32, occupied: u8_1d, occ_res: ti.i32,
                   occ_grids: ti.i32, out_node: i32_2d, out_local: f32_2d):
    """Per sample (ray r, sample s) at p = o_r + t[r, s] d_r: its LoD node, or -1 where it is not evaluated
    (delta 0, outside the box, pruned space, or an empty voxel of the occupancy grids when occ_res > 0), and p in
    its node's cube mapped to [0, 1]^3 (out_local row r * S + s, written for assigned samples only).

    The level comes from the footprint radius t * radius[r] (radius: the pixel cone's angular radius).
    `occupied` holds `occ_grids` grids of occ_res^3 voxels; a node of depth d reads grid min(d, occ_grids - 1)."""
    n_samples = t.shape[1]
    for r, s in ti.ndrange(t.shape[0], n_samples):
        tt = t[r, s]
        px = origins[r, 0] + tt * directions[r, 0]
        py = origins[r, 1] + tt * directions[r, 1]
        pz = origins[r, 2] + tt * directions[r, 2]
        node = -1
        if deltas[r, s] > 0:
            node = _sample_node(children, split, node_depth, geo, px, py, pz, tt * radius[r], root_size, max_depth,
                                deepest, occupied, occ_res, occ_grids)
        out_node[r, s] = node
        if node >= 0:
            _write_local(center, half, node, px, py, pz, out_local, r * n_samples + s)


@ti.func
def _sample_node(children: ti.template(), split: ti.template(), node_depth: ti.template(), geo: ti.template(),
                 px: ti.f32, py: ti.f32, pz: ti.f32, sample_radius: ti.f32, root_size: ti.f64, max_depth: ti.i32,
                 deepest: ti.i32, occupied: ti.template(), occ_res: ti.i32, occ_grids: ti.i32) -> ti.i32:
    """The LoD node of a sample, or -1 (outside the box, pruned space, an empty voxel of its depth's grid)."""
    node = _descend(children, split, geo, px, py, pz, _level(sample_radius, root_size, deepest), max_depth, deepest)
    if node >= 0 and occ_res > 0:
        top = ti.cast(occ_res - 1, ti.f32)
        vx = ti.cast(ti.min(ti.max(ti.floor((px - geo[GEO_OCC_MIN]) * geo[GEO_OCC_INV_VOXEL]), 0.0), top), ti.i32)
        vy = ti.cast(ti.min(ti.max(ti.floor((py - geo[GEO_OCC_MIN + 1]) * geo[GEO_OCC_INV_VOXEL + 1]), 0.0), top),
                     ti.i32)
        vz = ti.cast(ti.min(ti.max(ti.floor((pz - geo[GEO_OCC_MIN + 2]) * geo[GEO_OCC_INV_VOXEL + 2]), 0.0), top),
                     ti.i32)
        g = ti.min(node_depth[node], occ_grids - 1)
        if occupied[((g * occ_res + vx) * occ_res + vy) * occ_res + vz] == 0:
            node = -1
    return node


@ti.func
def _write_local(center: ti.template(), half: ti.template(), node, px, py, pz, out_local: ti.template(), row):
    h = half[node]
    out_local[row, 0] = ti.min(ti.max((px - center[node, 0] + h) / (2.0 * h), 0.0), 1.0)
    out_local[row, 1] = ti.min(ti.max((py - center[node, 1] + h) / (2.0 * h), 0.0), 1.0)
    out_local[row, 2] = ti.min(ti.max((pz - center[node, 2] + h) / (2.0 * h), 0.0), 1.0)


@fast_kernel
@ti.kernel
def march_count(origins: f32_2d, directions: f32_2d, t_near: f32_1d, t_far: f32_1d, radius: f32_1d, trans: f32_1d,
                cutoff: ti.f32, rays: i32_1d, s0: ti.i32, s1: ti.i32, n_samples: ti.i32, children: i32_2d,
                split: i32_1d, node_depth: i32_1d, geo: f32_1d, root_size: ti.f64, max_depth: ti.i32,
                deepest: ti.i32, occupied: u8_1d, occ_res: ti.i32, occ_grids: ti.i32, counts: i32_1d):
    """counts[k]: samples of ray rays[k] in bins s0..s1-1 that have a node (`assign_samples`' rule, with the bins
    of `tinn.render.stratified_t` without jitter: n_samples bins over [t_near, t_far], midpoints); none for a
    ray whose transmittance trans[r] is at most `cutoff` (early ray termination)."""
    for k in range(rays.shape[0]):
        r = rays[k]
        step = bin_step(t_near, t_far, r, n_samples)
        c = 0
        if step > 0.0 and trans[r] > cutoff:
            for s in range(s0, s1):
                tt, px, py, pz = bin_point(origins, directions, t_near, r, s, step)
                node = _sample_node(children, split, node_depth, geo, px, py, pz, tt * radius[r], root_size,
                                    max_depth, deepest, occupied, occ_res, occ_grids)
                if node >= 0:
                    c += 1
        counts[k] = c


@fast_kernel
@ti.kernel
def march_emit(origins: f32_2d, directions: f32_2d, t_near: f32_1d, t_far: f32_1d, radius: f32_1d, trans: f32_1d,
               cutoff: ti.f32, rays: i32_1d, s0: ti.i32, s1: ti.i32, n_samples: ti.i32, children: i32_2d,
               split: i32_1d, node_depth: i32_1d, center: f32_2d, half: f32_1d, geo: f32_1d, root_size: ti.f64,
               max_depth: ti.i32, deepest: ti.i32, occupied: u8_1d, occ_res: ti.i32, occ_grids: ti.i32, offsets: i32_1d, out_node: i32_1d,
               out_local: f32_2d, out_delta: f32_1d):
    """The samples `march_count` counted, packed at offsets[k] front to back: node, local coordinates, bin length."""
    for k in range(rays.shape[0]):
        r = rays[k]
        step = bin_step(t_near, t_far, r, n_samples)
        row = offsets[k]
        if step > 0.0 and trans[r] > cutoff:
            for s in range(s0, s1):
                tt, px, py, pz = bin_point(origins, directions, t_near, r, s, step)
                node = _sample_node(children, split, node_depth, geo, px, py, pz, tt * radius[r], root_size,
                                    max_depth, deepest, occupied, occ_res, occ_grids)
                if node >= 0:
                    out_node[row] = node
                    out_delta[row] = step
                    _write_local(center, half, node, px, py, pz, out_local, row)
                    row += 1

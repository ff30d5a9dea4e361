"""A sparse octree over a scene box, stored as flat tensors, and level-of-detail node selection.

`Octree.build(points, box_min, box_max, max_depth, min_points)` subdivides the cubic box around
the given (surface) points: a node splits while it holds more than `min_points` points and is
shallower than `max_depth`; children that would hold no point are never created (empty space is
pruned). Every node is one row of flat tensors (depth, centre, half size, parent, 8 children with
-1 for none, first/count of its points in the Morton-sorted point array), node ids are assigned
breadth first (all nodes of a depth are contiguous) and a node id is also the id of the network
that models the node.

`lookup(points, levels)` finds, for each point, the node of depth `levels[i]` containing it: one
Taichi thread per point walks the child table from the root (`tinn.kernels.octree`). Where the
descent reaches a leaf before `levels[i]` the leaf is used (clamped to the deepest existing node);
a point outside the box, or one whose descent needs a child that was pruned, gets -1 (empty:
zero density, not evaluated).

`levels_for_radius(sample_radius, root_size)` is the level rule: floor(log2(root_size / r)),
clamped below at 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from ... import checks
from ...errors import InputError

MAX_DEPTH = 16          # 3 * 16 Morton bits fit an int64 with room to spare
CHILD_SLOTS = 8         # slot = bx + 2 by + 4 bz, b = 1 on the upper half of the axis


def _as_box(name: str, value, device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32)
    if t.shape != (3,):
        raise InputError(f"{name} must have shape (3,), got {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise InputError(f"{name} contains NaN or Inf: {t.tolist()}")
    return t.to(device)


def _check_points(name: str, points) -> torch.Tensor:
    if not isinstance(points, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor of shape (n, 3), got {type(points).__name__}")
    if points.dim() != 2 or points.shape[1] != 3:
        raise InputError(f"{name} must have shape (n, 3), got {tuple(points.shape)}")
    if not points.is_floating_point():
        raise InputError(f"{name} has dtype {points.dtype}; allowed: a floating dtype (torch.float32)")
    return points.float()


def cube_around(box_min: torch.Tensor, box_max: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Centre and edge length of the smallest cube containing the box (octree cells stay cubes)."""
    return (box_min + box_max) * 0.5, float((box_max - box_min).max())


def cell_coords(points: torch.Tensor, root_min: torch.Tensor, edge: float, depth: int) -> torch.Tensor:
    """Integer cell of each point on the 2^depth grid over the root cube, (n, 3) int64, clamped to the grid.

    Build and lookup share this one function, so a point on a cell boundary lands in the same cell in both.
    """
    cells = 1 << depth
    q = torch.floor((points - root_min) * (cells / edge))
    return q.clamp_(0, cells - 1).to(torch.int64)


def morton_codes(q: torch.Tensor, depth: int) -> torch.Tensor:
    """Interleave the bits of integer cells (n, 3): the code's top 3 bits are the root's child slot, and so on."""
    code = torch.zeros(q.shape[0], dtype=torch.int64, device=q.device)
    for bit in range(depth - 1, -1, -1):
        slot = ((q[:, 0] >> bit) & 1) | (((q[:, 1] >> bit) & 1) << 1) | (((q[:, 2] >> bit) & 1) << 2)
        code = (code << 3) | slot
    return code


def inside_box(points: torch.Tensor, box_min: torch.Tensor, box_max: torch.Tensor) -> torch.Tensor:
    return ((points >= box_min) & (points <= box_max)).all(dim=1)


def levels_for_radius(sample_radius: torch.Tensor, root_size: float) -> torch.Tensor:
    """LoD level of each sample: floor(log2(root_size / sample_radius)), at least 0, as int32.

    `root_size` is the root's footprint in the units of the radius (its edge length, or its edge divided by the
    resolution of a node's grid when node size should match the grid's cell size). A radius of 0 asks for the
    finest level; lookups clamp any level to the deepest node that exists along the descent.
    """
    if not isinstance(sample_radius, torch.Tensor) or not sample_radius.is_floating_point():
        raise InputError("sample_radius must be a floating torch.Tensor")
    if not (isinstance(root_size, (int, float)) and math.isfinite(root_size) and root_size > 0):
        raise InputError(f"root_size={root_size!r} must be a finite number > 0")
    if checks.sync_checks_enabled() and sample_radius.numel() and bool((sample_radius < 0).any()
                                                                       | torch.isnan(sample_radius).any()):
        raise InputError("sample_radius must be >= 0 and not NaN")
    # The octree kernel's rule, exactly: the largest L with r * 2^L <= root_size. A logarithm is not exact on
    # every device (CUDA's float64 log2(8) rounds below 3), so the exponent comes from frexp of the quotient
    # and is then corrected by one either way against exact power-of-two products (the quotient may round).
    r = sample_radius.double()
    _, exponent = torch.frexp(root_size / r)               # root / r = m 2^e with m in [0.5, 1): floor(log2) = e - 1
    level = exponent.long().clamp(-1000, 1000) - 1
    root = torch.tensor(root_size, dtype=torch.float64, device=r.device)
    level = level - (r * _pow2(level) > root).long()
    level = level + (r * _pow2(level + 1) <= root).long()
    level = torch.where(r == 0, 1 << 20, level.clamp(0, 1 << 20))   # radius 0: the finest level there is
    return level.to(torch.int32)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as exact float64 (normal range), built from its bits."""
    return ((exponent.clamp(-1022, 1023) + 1023) << 52).view(torch.float64)


@dataclass
class Octree:
    """Flat node arrays (row i = node i = network i). Build with `Octree.build`."""

    depth: torch.Tensor         # (N,) int32
    center: torch.Tensor        # (N, 3) float32
    half_size: torch.Tensor     # (N,) float32: half the node's edge length
    parent: torch.Tensor        # (N,) int32, -1 for the root
    children: torch.Tensor      # (N, 8) int32, -1 where the child was pruned or the node is a leaf
    point_first: torch.Tensor   # (N,) int64: the node's points are points[first:first + count]
    point_count: torch.Tensor   # (N,) int64
    points: torch.Tensor        # (P, 3) float32: the points inside the box, Morton-sorted
    box_min: torch.Tensor       # (3,) float32: the scene box the octree was asked to cover
    box_max: torch.Tensor       # (3,) float32
    root_min: torch.Tensor      # (3,) float32: corner of the cubic root
    edge: float                 # root edge length
    max_depth: int              # the depth limit it was built with (deepest node may be shallower)

    # Also set in __post_init__: split (N,) bool (the node has children), deepest (depth of the deepest node).

    def __post_init__(self):
        # Cached once so lookups never sync the device for them.
        self.split = (self.children >= 0).any(dim=1)
        self.deepest = int(self.depth.max())
        self.kernel_tables = KernelTables(self)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def build(cls, points: torch.Tensor, box_min, box_max, max_depth: int, min_points: int) -> "Octree":
        """Subdivide the cube around [box_min, box_max] where the points are.

        A node splits while it holds more than `min_points` points and its depth is below `max_depth`;
        only children holding points are created. Points outside the box are ignored.
        """
        points = _check_points("points", points)
        device = points.device
        box_min, box_max = _as_box("box_min", box_min, device), _as_box("box_max", box_max, device)
        if not bool((box_max > box_min).all()):
            raise InputError(f"box_max must exceed box_min on every axis, got box_min={box_min.tolist()}, "
                             f"box_max={box_max.tolist()}")
        if not isinstance(max_depth, int) or isinstance(max_depth, bool) or not 0 <= max_depth <= MAX_DEPTH:
            raise InputError(f"max_depth={max_depth!r} must be an integer in 0..{MAX_DEPTH}")
        if not isinstance(min_points, int) or isinstance(min_points, bool) or min_points < 0:
            raise InputError(f"min_points={min_points!r} must be an integer >= 0")
        if points.numel() and not bool(checks.all_finite(points)):
            raise InputError("points contains NaN or Inf")
        points = points[inside_box(points, box_min, box_max)]
        if points.shape[0] == 0:
            raise InputError("no point lies inside [box_min, box_max]: the octree would be empty")

        center0, edge = cube_around(box_min, box_max)
        root_min = center0 - edge / 2
        code = morton_codes(cell_coords(points, root_min, edge, max_depth), max_depth)
        code, order = torch.sort(code)
        points = points[order].contiguous()
        n_points = points.shape[0]

        # Nodes are appended depth by depth (breadth first); per-node tensors grow by concatenation.
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        depth, parent = torch.zeros(1, **i32), torch.full((1,), -1, **i32)
        center, half = center0[None], torch.full((1,), edge / 2, device=device)
        first, count = torch.zeros(1, **i64), torch.full((1,), n_points, **i64)
        links = []                                        # (parent, slot, child) rows
        node_of_point = torch.zeros(n_points, **i64)      # each point's node at the current depth, -1 once done
        for d in range(max_depth):
            moving = node_of_point >= 0
            moving &= (count > min_points)[node_of_point.clamp(min=0)]
            idx = torch.nonzero(moving).squeeze(1)        # whole node ranges, in Morton order
            if idx.numel() == 0:
                break
            prefix = code[idx] >> (3 * (max_depth - d - 1))   # the point's cell at depth d + 1
            uniq, inverse, ucount = torch.unique_consecutive(prefix, return_inverse=True, return_counts=True)
            new_first = idx[torch.cumsum(ucount, 0) - ucount]
            parents = node_of_point[new_first]
            slots = uniq & 7
            new_ids = depth.shape[0] + torch.arange(uniq.shape[0], **i64)
            signs = torch.stack([(slots >> a) & 1 for a in range(3)], dim=1).float() * 2 - 1
            new_half = half[parents] / 2
            center = torch.cat([center, center[parents] + signs * new_half[:, None]])
            half = torch.cat([half, new_half])
            depth = torch.cat([depth, torch.full((uniq.shape[0],), d + 1, **i32)])
            parent = torch.cat([parent, parents.to(torch.int32)])
            first, count = torch.cat([first, new_first]), torch.cat([count, ucount])
            links.append(torch.stack([parents, slots, new_ids], dim=1))
            node_of_point = torch.full_like(node_of_point, -1)
            node_of_point[idx] = new_ids[inverse]

        children = torch.full((depth.shape[0], CHILD_SLOTS), -1, **i32)
        if links:
            rows = torch.cat(links)
            children[rows[:, 0], rows[:, 1]] = rows[:, 2].to(torch.int32)
        return cls(depth=depth, center=center.contiguous(), half_size=half, parent=parent, children=children,
                   point_first=first, point_count=count, points=points, box_min=box_min, box_max=box_max,
                   root_min=root_min, edge=edge, max_depth=max_depth)

    # ---- queries --------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return int(self.depth.shape[0])

    @property
    def device(self) -> torch.device:
        return self.depth.device

    def is_leaf(self) -> torch.Tensor:
        return ~self.split

    def nodes_per_level(self) -> list[int]:
        return torch.bincount(self.depth.long(), minlength=self.deepest + 1).tolist()

    def to(self, device) -> "Octree":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        return Octree(**moved)

    def local_coords(self, points: torch.Tensor, node_ids: torch.Tensor) -> torch.Tensor:
        """Points in their node's cube mapped to [0, 1]^3 (ids must be valid, >= 0)."""
        ids = node_ids.long()
        h = self.half_size[ids][:, None]
        return (points - self.center[ids] + h) / (2 * h)

    def lookup(self, points: torch.Tensor, levels) -> torch.Tensor:
        """Node id (int32) at depth `levels` containing each point, clamped to the deepest node on the way; -1 for
        points outside the box or in pruned (empty) space.

        `levels` is an int tensor (n,) or one int; levels below 0 select the root.
        """
        points = _check_points("points", points)
        if points.device != self.device:
            raise InputError(f"points is on {points.device} but the octree is on {self.device}")
        n = points.shape[0]
        if isinstance(levels, int) and not isinstance(levels, bool):
            levels = torch.full((n,), levels, dtype=torch.int32, device=self.device)
        if not isinstance(levels, torch.Tensor) or levels.is_floating_point() or levels.dtype == torch.bool:
            raise InputError("levels must be an int or an integer torch.Tensor of shape (n,)")
        if levels.shape != (n,):
            raise InputError(f"levels must have shape ({n},) to match points, got {tuple(levels.shape)}")
        if levels.device != self.device:
            raise InputError(f"levels is on {levels.device} but the octree is on {self.device}")
        out = torch.empty(n, dtype=torch.int32, device=self.device)
        if n:
            from ...kernels import octree as octree_kernels

            k = self.kernel_tables
            levels = levels.long().clamp(-1, MAX_DEPTH + 1).to(torch.int32).contiguous()
            octree_kernels.lookup(points.contiguous(), levels, k.children, k.split, k.geometry(), self.max_depth,
                                  self.deepest, out)
        return out


class KernelTables:
    """The octree as the Taichi kernels read it: int32 child table, split flags, the geometry vector."""

    def __init__(self, tree: Octree):
        self.children = tree.children.to(torch.int32).contiguous()
        self.split = tree.split.to(torch.int32).contiguous()
        self.depth = tree.depth.to(torch.int32).contiguous()
        self.center = tree.center.float().contiguous()
        self.half_size = tree.half_size.float().contiguous()
        self._base = torch.cat([tree.box_min.float(), tree.box_max.float(), tree.root_min.float(),
                                torch.tensor([(1 << tree.max_depth) / tree.edge], device=tree.device)])
        self._geo = (None, None)  # (occupancy grid or None, its geometry vector): the last one asked for

    def geometry(self, occupancy=None) -> torch.Tensor:
        """(GEO_SIZE,) float32: box, root corner, cell scale and the occupancy grid's corner and inverse voxel size."""
        grid, geo = self._geo
        if geo is None or grid is not occupancy:
            if occupancy is None:
                occ = torch.zeros(6, device=self._base.device)
            else:
                occ = torch.cat([occupancy.box_min.float(), 1.0 / occupancy.voxel_size.float()]).to(self._base.device)
            geo = torch.cat([self._base, occ]).contiguous()
            self._geo = (occupancy, geo)
        return geo

"""Empty-space skipping for an octree LoD field: one occupancy grid per octree depth.

A sample is evaluated by a node of some depth d, and the node of depth d models the scene low-passed to
its own scale: coarse nodes spread their density wider than fine ones. One grid over all depths would
have to keep the union (the coarse nodes' halo) for every sample; a grid per depth keeps, for depth d,
only the voxels where the depth-d nodes have density, so fine samples skip the coarse halo.

`LevelOccupancy.from_field(field, resolution, threshold)` evaluates every depth's node at `n_jitter`
points per voxel (the centre and uniform jittered points) in one batch per chunk of voxels, keeps the
voxels whose largest density exceeds `threshold`, and grows them by `dilate` voxels. Grid d voxel
(ix, iy, iz) is `occupied[d, ix, iy, iz]`; ix grows with x. The render kernel reads grid
min(node depth, depths - 1) at the sample's voxel, so a single `OccupancyGrid` works too (one grid for
every depth).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import checks
from .occupancy import VoxelBox, check_build_options


class LevelOccupancy(VoxelBox):
    """`occupied` (D, R, R, R) bool over the box [box_min, box_max]: grid d for samples of depth-d nodes."""

    lead = 1
    shape_name = "(depths, R, R, R)"

    @property
    def depths(self) -> int:
        return int(self.occupied.shape[0])

    @classmethod
    @torch.no_grad()
    def from_field(cls, field, resolution: int, threshold: float, n_jitter: int = 4, dilate: int = 1,
                   chunk: int = 1 << 15, seed: int = 0) -> "LevelOccupancy":
        """Grid d: voxels where the depth-d nodes' density (`field.octree.lookup(points, d)`, clamped to the leaf)
        exceeds `threshold` at one of `n_jitter` points, grown by `dilate` voxels."""
        resolution = check_build_options(resolution, n_jitter, dilate, threshold)
        tree = field.octree
        lo, hi = tree.box_min, tree.box_max
        dev, depths = lo.device, tree.deepest + 1
        voxel = (hi - lo) / resolution
        r = torch.arange(resolution, device=dev, dtype=torch.float32)
        ijk = torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)
        n = ijk.shape[0]
        gen = torch.Generator(device=dev).manual_seed(seed)
        best = torch.zeros(depths, n, device=dev)
        level_of = torch.arange(depths, dtype=torch.int32, device=dev)
        for k in range(n_jitter):
            for start in range(0, n, chunk):
                cell = ijk[start:start + chunk]
                u = torch.full_like(cell, 0.5) if k == 0 else torch.rand(cell.shape, device=dev, generator=gen)
                points = (lo + (cell + u) * voxel).repeat(depths, 1)       # every depth of every point, one batch
                ids = tree.lookup(points, level_of.repeat_interleave(cell.shape[0]))
                keep = torch.nonzero(ids >= 0).squeeze(1)
                sigma = torch.zeros(points.shape[0], device=dev)
                with checks.disabled():  # ids come from the octree
                    sigma[keep] = field.query(points[keep], ids[keep])[0]
                end = start + cell.shape[0]
                best[:, start:end] = torch.maximum(best[:, start:end], sigma.view(depths, -1))
        occupied = (best > float(threshold)).view(depths, 1, resolution, resolution, resolution)
        if dilate:
            occupied = F.max_pool3d(occupied.float(), 2 * dilate + 1, stride=1, padding=dilate) > 0
        return cls(occupied[:, 0], lo, hi)

    def query(self, points: torch.Tensor, depth: torch.Tensor) -> torch.Tensor:
        """(M,) bool: the point lies in the box and in an occupied voxel of grid min(depth, depths - 1)."""
        inside = ((points >= self.box_min) & (points <= self.box_max)).all(dim=1)
        q = torch.floor((points - self.box_min) / self.voxel_size).clamp_(0, self.resolution - 1).to(torch.int64)
        g = depth.long().clamp(0, self.depths - 1)
        r = self.resolution
        return self.occupied.reshape(-1)[((g * r + q[:, 0]) * r + q[:, 1]) * r + q[:, 2]] & inside

    def occupied_fraction(self) -> list[float]:
        """Share of occupied voxels, per depth."""
        return self.occupied.float().mean(dim=(1, 2, 3)).tolist()

    def memory_bytes(self) -> int:
        return self.occupied.numel() * self.occupied.element_size()

    def __repr__(self) -> str:
        shares = ", ".join(f"{f:.3f}" for f in self.occupied_fraction())
        return f"LevelOccupancy(resolution={self.resolution}, depths={self.depths}, occupied=[{shares}])"

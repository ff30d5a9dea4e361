"""A boolean voxel grid over the scene box that marks where density is: empty-space skipping.

`OccupancyGrid.from_density(density, box_min, box_max, resolution, threshold)` evaluates a density
function (a trained teacher, an analytic scene) at a few jittered points in every voxel and keeps
the voxels whose largest value exceeds `threshold`. The max over several points, plus an optional
dilation by whole voxels, keeps thin surfaces that fall between voxel centres.

Renderers test samples with `query(points)` and evaluate networks only where it is True;
distillation draws its training points with `sample(n)` (uniform over the occupied volume).
Voxel (ix, iy, iz) is `occupied[ix, iy, iz]`; ix grows with x.

A grid can also track a field while it trains, as instant-ngp's density grid does:
`OccupancyGrid.tracking(box_min, box_max, resolution)` starts with every voxel occupied and a tracked
density per voxel; each `update(density, threshold)` decays the tracked values, evaluates the field at one
jittered point in a share of the voxels (a random share plus every occupied one), keeps the larger value,
and marks the voxels whose tracked density exceeds the threshold. Density the field paints into empty
space decays away once the field stops producing it there.

`tracking(..., within=grid)` tracks inside another grid only: it starts as that grid and can only shed voxels.
A KiloNeRF student fine-tunes this way inside the grid built from its teacher: its cells' networks are
undefined outside it (never trained there), and inside it the voxels where the student leaves only faint
density (what distillation smeared from the teacher's own faint floaters) drop out of training and rendering.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import checks, runtime
from ...checks import check_points
from ...errors import InputError
from ...render.pending import PendingCount
from ...render.sampling import positions

MAX_RESOLUTION = 1024  # 1024^3 booleans = 1 GiB; more is a mistake, not a scene


def as_box(box_min, box_max, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(3,) float32 box corners on `device` (tinn's device by default), checked: finite, max > min per axis."""
    device = device or runtime.device()
    out = []
    for name, value in (("box_min", box_min), ("box_max", box_max)):
        t = torch.as_tensor(value, dtype=torch.float32).detach().reshape(-1) if not isinstance(value, torch.Tensor) \
            else value.detach().float().reshape(-1)
        if t.shape != (3,):
            raise InputError(f"{name} must have 3 entries (x, y, z), got shape {tuple(t.shape)}")
        if not bool(torch.isfinite(t).all()):
            raise InputError(f"{name} contains NaN or Inf: {t.tolist()}")
        out.append(t.to(device))
    if not bool((out[1] > out[0]).all()):
        raise InputError(f"box_max must exceed box_min on every axis, got box_min={out[0].tolist()}, "
                         f"box_max={out[1].tolist()}")
    return out[0], out[1]


def check_resolution(name: str, value, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise InputError(f"{name}={value!r} is out of range; allowed: an integer in 1..{hi}")
    return value


def check_build_options(resolution, n_jitter, dilate, threshold) -> int:
    """The options of building a grid from a density: validated; returns the resolution."""
    resolution = check_resolution("resolution", resolution, MAX_RESOLUTION)
    check_resolution("n_jitter", n_jitter, 1024)
    if isinstance(dilate, bool) or not isinstance(dilate, int) or dilate < 0:
        raise InputError(f"dilate={dilate!r} must be an integer >= 0 (voxels)")
    if not float(threshold) >= 0.0:
        raise InputError(f"threshold={threshold!r} must be a density >= 0")
    return resolution


class VoxelBox:
    """Boolean voxels over the box [box_min, box_max]: `occupied` has `lead` leading dimensions, then a cube
    (R, R, R). Validates and places them; the grids below add what they track."""

    lead = 0
    shape_name = "cubic (R, R, R)"

    def __init__(self, occupied: torch.Tensor, box_min, box_max):
        dims = self.lead + 3
        if not isinstance(occupied, torch.Tensor) or occupied.dtype != torch.bool or occupied.dim() != dims \
                or len(set(occupied.shape[self.lead:])) != 1:
            got = f"{occupied.dtype} {tuple(occupied.shape)}" if isinstance(occupied, torch.Tensor) \
                else type(occupied).__name__
            raise InputError(f"occupied must be a {self.shape_name} torch.bool tensor, got {got}")
        check_resolution("resolution", int(occupied.shape[self.lead]), MAX_RESOLUTION)
        self.box_min, self.box_max = as_box(box_min, box_max)
        self.occupied = occupied.to(self.box_min.device).contiguous()
        self.resolution = int(occupied.shape[self.lead])
        self.voxel_size = (self.box_max - self.box_min) / self.resolution


class OccupancyGrid(VoxelBox):
    """`occupied` (R, R, R) bool over the box [box_min, box_max]."""

    def __init__(self, occupied: torch.Tensor, box_min, box_max):
        super().__init__(occupied, box_min, box_max)
        self.density: torch.Tensor | None = None  # the tracked density per voxel (tracking grids only)
        self.within: torch.Tensor | None = None   # tracking grids: the voxels that may be occupied (None: all)
        self.updates = 0
        # `sample`'s list of occupied voxels and the state of `occupied` it was listed from (see occupied_voxels)
        self._voxels: tuple[torch.Tensor, int, torch.Tensor] | None = None
        # `update`'s list of the voxels `within` allows and the state of `within` it was listed from
        self._allowed: tuple[torch.Tensor, int, torch.Tensor] | None = None
        # The number of occupied voxels an update left, on its way to the host, and the state of `occupied` it
        # counts: the next update's size of the occupied part (see update)
        self._occupied_count: tuple[torch.Tensor, int, PendingCount] | None = None
        self._strides_kept: tuple[tuple, torch.Tensor] | None = None  # `query`'s flat-index strides, per device

    @classmethod
    def tracking(cls, box_min, box_max, resolution: int, within: "OccupancyGrid | None" = None) -> "OccupancyGrid":
        """A grid that follows a training field through `update`: every voxel occupied until the first update,
        or with `within` (a grid over the same box and resolution) that grid's voxels, never more."""
        resolution = check_resolution("resolution", resolution, MAX_RESOLUTION)
        lo, hi = as_box(box_min, box_max)
        allowed = None
        if within is not None:
            if not isinstance(within, OccupancyGrid) or within.lead != 0:
                raise InputError(f"within must be an OccupancyGrid, got {type(within).__name__}")
            if within.resolution != resolution:
                raise InputError(f"within has resolution {within.resolution}; allowed: the tracking grid's "
                                 f"resolution {resolution}")
            if not (torch.allclose(within.box_min.to(lo.device), lo) and torch.allclose(within.box_max.to(lo.device), hi)):
                raise InputError(f"within covers the box {within.box_min.tolist()}..{within.box_max.tolist()}; "
                                 f"allowed: the tracking grid's box {lo.tolist()}..{hi.tolist()}")
            allowed = within.occupied.to(lo.device).clone()
        start = torch.ones((resolution,) * 3, dtype=torch.bool, device=lo.device) if allowed is None else allowed
        grid = cls(start.clone(), box_min, box_max)
        grid.density = torch.zeros((resolution,) * 3, dtype=torch.float32, device=lo.device)
        grid.within = allowed
        grid.allowed_voxels()  # listed here, while the grid is built, so that no update reads the device
        return grid

    def allowed_voxels(self) -> torch.Tensor | None:
        """Flat indices (int64, ascending) of the voxels a tracking grid may occupy: those of `within`, None
        where every voxel may be. Listing them reads the device; `within` is fixed for the grid's life, so they
        are listed once (anew only if `within` is replaced or written in place)."""
        return None if self.within is None else self._listed("_allowed", self.within)

    @torch.no_grad()
    def update(self, density, threshold: float, decay: float = 0.95, random_share: float = 0.5,
               generator: torch.Generator | None = None, chunk: int = 1 << 18) -> torch.Tensor:
        """One tracking step (see the module notes); returns the occupied fraction afterwards as a 0-d tensor on
        the grid's device (`float()` of it waits for the device). The update only issues device work: it reads
        one count on the host, the number of voxels the previous update left occupied, which reached the host
        long before (a `PendingCount` started by that update).

        `density(points (M, 3)) -> (M,)` is the field's density, called without gradients and without the sync
        checks (the points are built here, inside the box); `threshold` is the density above which a voxel counts
        as occupied (capped at the mean tracked density); `decay` in [0, 1) is how much of the tracked value
        survives one update; `random_share` of the voxels (of `within`'s, with `within`), drawn without repeats,
        is re-evaluated besides the occupied ones (all of them at the first update, so nothing is missed at the
        start).
        """
        if self.density is None:
            raise InputError("update() needs a tracking grid: build it with OccupancyGrid.tracking(...)")
        if not 0.0 <= float(decay) < 1.0:
            raise InputError(f"decay={decay!r} must be in [0, 1)")
        if not 0.0 <= float(random_share) <= 1.0:
            raise InputError(f"random_share={random_share!r} must be in [0, 1]")
        if not float(threshold) >= 0.0:
            raise InputError(f"threshold={threshold!r} must be a density >= 0")
        dev = self.occupied.device
        allowed = self.allowed_voxels()
        n_allowed = self.occupied.numel() if allowed is None else allowed.numel()
        # The voxels to evaluate, in sets whose sizes the host knows without asking the device (asking would
        # wait until the device has drained; see render/pending.py). `valid` (None: all) drops padding.
        if self.updates == 0:
            cells, valid = (torch.arange(n_allowed, device=dev) if allowed is None else allowed), None
        else:
            occupied, valid = self._occupied_cells(allowed, n_allowed)
            # A fixed number of distinct random voxels (a permutation's head): the random share exactly.
            n_drawn = round(float(random_share) * n_allowed)
            drawn = torch.randperm(n_allowed, device=dev, generator=generator)[:n_drawn]
            cells = torch.cat([occupied, drawn if allowed is None else allowed[drawn]])
            if valid is not None:
                valid = torch.cat([valid, torch.ones_like(drawn, dtype=torch.bool)])
        values = torch.empty(cells.numel(), dtype=torch.float32, device=dev)
        r = self.resolution
        with checks.disabled():
            for start in range(0, cells.numel(), chunk):
                pick = cells[start:start + chunk]
                ijk = torch.stack([pick // (r * r), (pick // r) % r, pick % r], dim=1).float()
                u = torch.rand(pick.numel(), 3, device=dev, generator=generator)
                values[start:start + chunk] = density((self.box_min + (ijk + u) * self.voxel_size).contiguous()
                                                      ).reshape(-1).float()
        if valid is not None:
            values = torch.where(valid, values, torch.full_like(values, -float("inf")))
        tracked = self.density.reshape(-1)
        tracked.mul_(float(decay))
        # A voxel can be both occupied and drawn at random: the largest of its values is kept, whatever the
        # order the device writes them in.
        tracked.scatter_reduce_(0, cells, values, "amax")
        # As instant-ngp: never above the mean tracked density, so a young field whose densities are all
        # below the threshold still keeps its denser half occupied (and trained). Compared on the device: the
        # float32 mean against the threshold rounded to float32, as a comparison with the number would be.
        cut = self.density.mean().clamp(max=float(threshold))
        occupied = self.density > cut
        self.occupied = (occupied if self.within is None else occupied & self.within).contiguous()
        self._occupied_count = (self.occupied, self.occupied._version, PendingCount(self.occupied.sum()))
        self.updates += 1
        return self.occupied.float().mean()

    def _occupied_cells(self, allowed: torch.Tensor | None, n_allowed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The occupied voxels an update evaluates (flat indices, ascending) and which entries are voxels (None:
        all). Listed to the size the last update counted when `occupied` is still what it left (that count was
        started an update ago: reading it does not wait for the device); otherwise (the grid was edited since)
        to `n_allowed`, a size no list can exceed, padded with an allowed voxel whose result is dropped.
        The last update's count rather than always `n_allowed`: an update then evaluates about as many voxels as
        a list of exactly the chosen ones would (occupied plus the random share), where `n_allowed` would add up
        to the whole allowed volume again, most of it padding (a grid over the whole box is mostly empty)."""
        occupied = self.occupied
        mask = occupied.reshape(-1) if self.within is None else (occupied & self.within).reshape(-1)
        kept = self._occupied_count
        if kept is not None and kept[0] is occupied and kept[1] == occupied._version:
            return positions(mask, kept[2].value()), None
        cells = positions(mask, n_allowed)
        valid = cells >= 0
        first = 0 if allowed is None or n_allowed == 0 else allowed[0]
        return torch.where(valid, cells, first), valid

    @classmethod
    @torch.no_grad()
    def from_density(cls, density, box_min, box_max, resolution: int, threshold: float, n_jitter: int = 8,
                     dilate: int = 1, chunk: int = 1 << 18, seed: int = 0) -> "OccupancyGrid":
        """Voxels where max(density) over `n_jitter` points (the centre and uniform jittered points in the
        voxel) exceeds `threshold`, then grown by `dilate` voxels in every direction.

        `density(points (M, 3)) -> (M,)` is called in chunks of `chunk` points, without gradients.
        """
        resolution = check_build_options(resolution, n_jitter, dilate, threshold)
        lo, hi = as_box(box_min, box_max)
        dev = lo.device
        voxel = (hi - lo) / resolution
        r = torch.arange(resolution, device=dev, dtype=torch.float32)
        ijk = torch.stack(torch.meshgrid(r, r, r, indexing="ij"), dim=-1).reshape(-1, 3)
        gen = torch.Generator(device=dev).manual_seed(seed)
        best = torch.full((ijk.shape[0],), -float("inf"), device=dev)
        for k in range(n_jitter):
            for start in range(0, ijk.shape[0], chunk):
                cell = ijk[start:start + chunk]
                u = torch.full_like(cell, 0.5) if k == 0 else torch.rand(cell.shape, device=dev, generator=gen)
                value = density((lo + (cell + u) * voxel).contiguous()).reshape(-1).float()
                best[start:start + chunk] = torch.maximum(best[start:start + chunk], value)
        occupied = (best > float(threshold)).reshape(resolution, resolution, resolution)
        if dilate:
            occupied = F.max_pool3d(occupied[None, None].float(), 2 * dilate + 1, stride=1, padding=dilate)[0, 0] > 0
        return cls(occupied, lo, hi)

    # ---- queries ------------------------------------------------------------------------------
    def voxel_of(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Integer voxel (M, 3) int64 of each point (clamped to the grid) and whether the point is in the box."""
        points = check_points("points", points)
        inside = ((points >= self.box_min) & (points <= self.box_max)).all(dim=1)
        q = torch.floor((points - self.box_min) / self.voxel_size).clamp_(0, self.resolution - 1).to(torch.int64)
        return q, inside

    def query(self, points: torch.Tensor) -> torch.Tensor:
        """(M,) bool: the point lies in the box and in an occupied voxel."""
        q, inside = self.voxel_of(points)
        return self.occupied.reshape(-1)[(q * self._strides(q.device)).sum(dim=1)] & inside

    def _strides(self, device: torch.device) -> torch.Tensor:
        """(r * r, r, 1) int64 on `device`: a voxel's flat index is (q * strides).sum(1) (two torch ops instead of
        four and three slices; each is host work a training step pays). Made once per resolution and device."""
        key = (self.resolution, device)
        kept = self._strides_kept
        if kept is None or kept[0] != key:
            r = self.resolution
            kept = self._strides_kept = (key, torch.tensor([r * r, r, 1], dtype=torch.int64).to(device))
        return kept[1]

    def occupied_fraction(self) -> float:
        return float(self.occupied.float().mean())

    def occupied_voxels(self) -> torch.Tensor:
        """Flat indices (int64, ascending) of the occupied voxels. Listing them reads the device (their number
        sizes the list), so the list is kept until `occupied` changes (another tensor, or written in place):
        a grid that stays as it is, as in distillation, is listed once."""
        return self._listed("_voxels", self.occupied)

    def _listed(self, slot: str, mask: torch.Tensor) -> torch.Tensor:
        """Flat indices (int64, ascending) of `mask`'s True entries, kept in attribute `slot` with the state of
        `mask` they were listed from, and listed anew (a read of the device) only when it changed: another
        tensor, or the same one written in place."""
        kept = getattr(self, slot)
        if kept is None or kept[0] is not mask or kept[1] != mask._version:
            kept = (mask, mask._version, torch.nonzero(mask.reshape(-1)).reshape(-1))
            setattr(self, slot, kept)
        return kept[2]

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """n points (n, 3) uniform over the occupied volume (every occupied voxel equally likely)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"n={n!r} must be an integer >= 0")
        flat = self.occupied_voxels()
        if flat.numel() == 0:
            raise InputError("the occupancy grid is empty: nothing to sample (lower the threshold?)")
        dev = self.occupied.device
        pick = flat[torch.randint(0, flat.numel(), (n,), device=dev, generator=generator)]
        r = self.resolution
        ijk = torch.stack([pick // (r * r), (pick // r) % r, pick % r], dim=1).float()
        u = torch.rand(n, 3, device=dev, generator=generator)
        return (self.box_min + (ijk + u) * self.voxel_size).contiguous()

    def memory_bytes(self) -> int:
        tracked = 0 if self.density is None else self.density.numel() * self.density.element_size()
        return self.occupied.numel() * self.occupied.element_size() + tracked

    def __repr__(self) -> str:
        return f"OccupancyGrid(resolution={self.resolution}, occupied={self.occupied_fraction():.3f})"

"""Level resolutions and parameter offsets of multiresolution grids (tcnn's rules).

Pure host-side arithmetic, kept apart from the kernels so it can be tested on
known values. Scales are computed in float32 exactly as tcnn does
(`exp2f(level * log2f(per_level_scale)) * base_resolution - 1`), because the
resolution is `ceil(scale) + 1` and a float64 computation can land on the other
side of an integer. The kernels receive these per-level numbers as tables, so
the layout and the lookups can never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID_TYPES = ("Hash", "Dense", "Tiled")
INTERPOLATIONS = ("Nearest", "Linear", "Smoothstep")
HASH_TYPES = ("CoherentPrime", "Prime", "ReversedPrime", "Rng", "BaseConvert")

# Spatial hash factors per hash type; dimension i uses factors[i] (tcnn's lcg hashes).
HASH_PRIMES = {
    "CoherentPrime": (1, 2654435761, 805459861, 3674653429, 2097192037, 1434869437, 2165219737),
    "Prime": (1958374283, 2654435761, 805459861, 3674653429, 2097192037, 1434869437, 2165219737),
    "ReversedPrime": (2165219737, 1434869437, 2097192037, 3674653429, 805459861, 2654435761, 1958374283),
}
# How the kernels combine a corner's coordinates: XOR of coordinate * factor (the prime hashes), the SUM of
# coordinate * factor (BaseConvert: ((c0 * B + c1) * B + ...) * B with B = 2531011, unrolled into one factor
# per dimension, B^(D - d) mod 2^32), or PCG32 jumped by the coordinates' bits (Rng).
HASH_XOR, HASH_SUM, HASH_RNG = 0, 1, 2
BASE_CONVERT_BASE = 2531011


def hash_code(hash_type: str, n_dims: int) -> tuple[int, tuple[int, ...]]:
    """(combination, per-dimension uint32 factors) of `hash_type` for `n_dims` coordinates."""
    if hash_type == "Rng":
        return HASH_RNG, (0,) * n_dims
    if hash_type == "BaseConvert":
        return HASH_SUM, tuple(pow(BASE_CONVERT_BASE, n_dims - d, 1 << 32) for d in range(n_dims))
    return HASH_XOR, tuple(HASH_PRIMES[hash_type][:n_dims])

# Largest resolution per dimension count whose dense stride res^D still fits in uint32.
MAX_DENSE_BASE = (0x0, 0xFFFFFFFF, 0xFFFF, 0x659, 0xFF)
MAX_N_LEVELS = 128
UINT32_MAX = 0xFFFFFFFF
LEVEL_ALIGNMENT = 8  # every level's entry count is rounded up to a multiple of 8


@dataclass(frozen=True)
class GridLevel:
    scale: float       # float32 value of exp2(level * log2(per_level_scale)) * base_resolution - 1
    resolution: int    # vertices per axis: ceil(scale) + 1
    offset: int        # first entry of the level (entries, not floats)
    size: int          # entries in the level (hash table size / dense size / tile size)


@dataclass(frozen=True)
class GridLayout:
    n_dims: int
    n_features_per_level: int
    grid_type: str
    levels: tuple

    @property
    def n_levels(self) -> int:
        return len(self.levels)

    @property
    def n_entries(self) -> int:
        return self.levels[-1].offset + self.levels[-1].size if self.levels else 0

    @property
    def n_params(self) -> int:
        """Floats per grid: entries times features per level."""
        return self.n_entries * self.n_features_per_level

    def level_is_hashed(self, level: int) -> bool:
        """Whether lookups at `level` go through the spatial hash (dense index would not fit)."""
        lv = self.levels[level]
        if self.grid_type != "Hash":
            return False
        dense = lv.resolution ** self.n_dims if lv.resolution <= MAX_DENSE_BASE[self.n_dims] else UINT32_MAX
        return lv.size < dense


def default_per_level_scale(grid_type: str, n_levels: int, base_resolution: int) -> float:
    """tcnn's default: 2 for hash/tiled grids; dense grids grow from base_resolution to 256."""
    if grid_type != "Dense":
        return 2.0
    if n_levels <= 1:
        return 1.0
    f32 = np.float32
    return float(np.exp(np.log(f32(256.0) / f32(base_resolution)) / f32(n_levels - 1)).astype(np.float32))


def level_scale(level: int, per_level_scale: float, base_resolution: int) -> np.float32:
    f32 = np.float32
    log2_scale = np.log2(f32(per_level_scale)).astype(np.float32)
    grown = np.exp2(f32(level) * log2_scale).astype(np.float32)
    return f32(grown * f32(base_resolution) - f32(1.0))


def level_resolution(scale: np.float32) -> int:
    return int(np.ceil(scale)) + 1


def grid_layout(n_dims: int, n_levels: int, n_features_per_level: int, log2_hashmap_size: int,
                base_resolution: int, per_level_scale: float, grid_type: str = "Hash") -> GridLayout:
    if grid_type not in GRID_TYPES:
        raise ValueError(f"grid_type={grid_type!r}; allowed: {list(GRID_TYPES)}")
    levels = []
    offset = 0
    max_params = UINT32_MAX // 2
    for level in range(n_levels):
        scale = level_scale(level, per_level_scale, base_resolution)
        res = level_resolution(scale)
        size = max_params if float(res) ** n_dims > max_params else res ** n_dims
        size = -(-size // LEVEL_ALIGNMENT) * LEVEL_ALIGNMENT
        if grid_type == "Tiled":
            size = min(size, base_resolution ** n_dims)
        elif grid_type == "Hash":
            size = min(size, 1 << log2_hashmap_size)
        levels.append(GridLevel(scale=float(scale), resolution=res, offset=offset, size=size))
        offset += size
    return GridLayout(n_dims=n_dims, n_features_per_level=n_features_per_level, grid_type=grid_type,
                      levels=tuple(levels))

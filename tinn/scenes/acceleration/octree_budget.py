"""How much grid an octree node gets: its finest resolution from the capture, its table size from a budget.

A node at depth d covers edge / 2^d of the root. The level-of-detail rule sends a sample of footprint radius r
to the deepest node whose grid cells are at least r wide, so the deepest nodes are only worth their place when
their finest grid cells are about as wide as the footprints of the closest views: otherwise the closest views
either ask for detail no node holds (the tree is too shallow or the node grids too coarse) or never reach the
deepest nodes (their grids finer than any pixel).

`leaf_resolution(tree, footprint)` is the level rule's cells per node edge that make the deepest nodes' cells
as wide as the footprint radius (the field's `lod_resolution`); a node's grid goes `oversample` times finer
than that, as a single grid's finest level goes finer than a pixel. `closest_footprint(images)` is the largest
footprint radius of a training view's sample in the scene box at full resolution (its farthest in-box point),
so every sample of every full-resolution view selects the deepest level. `capture_depth` is the deepest depth
whose nodes still get `min_leaf_resolution` cells from that rule (`DEFAULT_MIN_LEAF_RESOLUTION`): deeper nodes
would each be fit to fewer rays and share the budget with more nodes, and cost seams, for detail the shallower
nodes' grids already hold. `budget_encoding` turns that
resolution and a parameter budget for the whole array into one node's hash-grid config: levels from `base_resolution` up to the leaf resolution
(growth at most `max_level_scale` per level), and the largest table that keeps every node's grid and MLP within
the budget. `budgeted_octree` chains the three for a capture: the one rule the demo and the benchmarks build by.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from ...errors import ConfigError, InputError
from ...render import pixel_radius

MIN_LOG2_HASHMAP, MAX_LOG2_HASHMAP = 8, 19
# How far `budget_encoding` fills a budget with levels: at most a single grid's 16 (tcnn's configs, the teacher's;
# every level is a lookup per sample), growing by no less than tcnn's configs do (1.38-1.5 per level).
MAX_FILL_LEVELS, MIN_LEVEL_SCALE = 16, 1.3
# The tree stops where nodes would span fewer footprints of the closest view than this: every node is fit only
# to the rays that reach it, so within one parameter budget and step count fewer, larger nodes fit better than
# more, finer ones until a node spans this many footprints (docs/design-notes.md, octree quality).
DEFAULT_MIN_LEAF_RESOLUTION = 256.0


def closest_footprint(images) -> float:
    """Footprint radius (scene units) of the farthest in-box sample of the closest full-resolution view.

    Each view's largest in-box distance is bounded by its distance to the box centre plus half the box
    diagonal; the footprint there is that distance times the pixel cone's radius. The minimum over views is
    taken: the view that asks for the finest detail."""
    if len(images) == 0:
        raise InputError("images holds no view")
    centre = (images.box_min + images.box_max).float() / 2
    half_diagonal = float((images.box_max - images.box_min).float().norm()) / 2
    distance = (images.c2w[:, :3, 3].float() - centre.to(images.c2w.device)).norm(dim=1)
    return (float(distance.min()) + half_diagonal) * pixel_radius(images.focal)


@torch.no_grad()
def surface_footprint(images, hull, quantile: float = 0.25, rays_per_side: int = 32, steps: int = 512) -> float:
    """Footprint radius (scene units) where the capture's views see the surface: for a capture whose views stand
    at several distances (close-ups), where `closest_footprint`'s farthest in-box point would stand for the
    surface a close-up actually sees.

    Each view casts `rays_per_side`^2 rays across its frame (the same field of view), marched in `steps` even
    steps through the box to their first voxel of `hull` (an OccupancyGrid, the training views' visual hull).
    The hits of all views are pooled, and their `quantile` of distance (0.25: a quarter of the capture's surface
    hits lie nearer), times the pixel cone's radius, is the footprint: the deepest nodes are then drawn and fit
    by that share of the surface samples. A single view's hits would let one view that happens to see a part close
    to it set the rule for all, and the typical close-up would draw its surface from levels above the deepest
    nodes, which none of its samples would reach. Raises if no ray meets the hull."""
    from ...render.rays import camera_rays, ray_box

    from .occupancy import OccupancyGrid

    if len(images) == 0:
        raise InputError("images holds no view")
    if not isinstance(hull, OccupancyGrid):
        raise InputError(f"hull must be an OccupancyGrid (tinn.scenes.acceleration.visual_hull(images)), got "
                         f"{type(hull).__name__}")
    if not (isinstance(quantile, (int, float)) and not isinstance(quantile, bool) and 0.0 <= quantile <= 1.0):
        raise InputError(f"quantile={quantile!r} must be a number in [0, 1]")
    for name, value in (("rays_per_side", rays_per_side), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name}={value!r} must be an integer >= 1")
    dev = hull.occupied.device
    focal = images.focal * rays_per_side / images.width
    frac = (torch.arange(steps, device=dev, dtype=torch.float32) + 0.5) / steps
    hits = []
    for c2w in images.c2w.to(dev).float():
        origins, dirs = camera_rays(c2w, rays_per_side, rays_per_side, focal)
        t0, t1 = ray_box(origins, dirs, hull.box_min, hull.box_max)
        t = t0[:, None] + (t1 - t0).clamp(min=0)[:, None] * frac[None]
        inside = hull.query((origins[:, None] + t[..., None] * dirs[:, None]).reshape(-1, 3)).view(-1, steps)
        hit = inside.any(dim=1) & (t1 > t0)
        if hit.any():
            first = inside[hit].float().argmax(dim=1)
            hits.append(t[hit].gather(1, first[:, None])[:, 0])
    if not hits:
        raise InputError("no view's rays meet the hull: it is empty or outside every view")
    return float(torch.quantile(torch.cat(hits), float(quantile))) * pixel_radius(images.focal)


def leaf_resolution(tree, footprint: float) -> float:
    """Cells per node edge that make the deepest nodes' cells `footprint` wide (the level rule's resolution)."""
    if not (isinstance(footprint, (int, float)) and math.isfinite(footprint) and footprint > 0):
        raise InputError(f"footprint={footprint!r} must be a finite number > 0")
    # A hair under the exact quotient: the footprint itself must select the deepest level after the rule's
    # own rounding (root_size = edge / resolution, then r * 2^deepest <= root_size).
    return tree.edge / (footprint * 2 ** tree.deepest) * (1.0 - 1e-6)


def capture_depth(edge: float, footprint: float, min_leaf_resolution: float = DEFAULT_MIN_LEAF_RESOLUTION,
                  limit: int = 16) -> int:
    """The deepest octree depth (0..limit) at which `leaf_resolution` is still >= min_leaf_resolution."""
    if not (math.isfinite(footprint) and footprint > 0 and min_leaf_resolution > 0):
        raise InputError(f"footprint={footprint!r} and min_leaf_resolution={min_leaf_resolution!r} must be > 0")
    ratio = edge / (footprint * min_leaf_resolution)
    return 0 if ratio < 2 else min(limit, int(math.floor(math.log2(ratio) + 1e-9)))


def grid_levels_for(finest: float, base_resolution: int = 2, max_level_scale: float = 2.0) -> tuple[int, float]:
    """(n_levels, per_level_scale) of a grid from `base_resolution` to `finest`, growing by at most
    `max_level_scale` per level."""
    if not (math.isfinite(finest) and finest > 0):
        raise ConfigError(f"finest resolution {finest!r} must be a finite number > 0")
    if not max_level_scale > 1.0:
        raise ConfigError(f"max_level_scale={max_level_scale!r} must be > 1")
    if finest <= base_resolution:
        return 1, 2.0
    n_levels = 1 + math.ceil(math.log(finest / base_resolution) / math.log(max_level_scale) - 1e-9)
    return n_levels, (finest / base_resolution) ** (1.0 / (n_levels - 1))


def node_params(encoding: dict, network: dict) -> int:
    """Parameters of one node: its grid table plus its MLP."""
    from ...encodings.grid_layout import grid_layout
    from ...models import NetworkWithInputEncoding

    layout = grid_layout(3, encoding["n_levels"], encoding["n_features_per_level"], encoding["log2_hashmap_size"],
                         encoding["base_resolution"], encoding["per_level_scale"], "Hash")
    grid = layout.n_params
    # The MLP does not depend on the table size: count it once on the smallest table.
    tiny = dict(encoding, log2_hashmap_size=MIN_LOG2_HASHMAP)
    tiny_layout = grid_layout(3, tiny["n_levels"], tiny["n_features_per_level"], MIN_LOG2_HASHMAP,
                              tiny["base_resolution"], tiny["per_level_scale"], "Hash")
    model = NetworkWithInputEncoding(3, 4, tiny, network, n_networks=1)
    mlp = sum(p.numel() for p in model.parameters()) - tiny_layout.n_params
    return grid + mlp


def budget_encoding(n_nodes: int, param_budget: int, finest_resolution: float, network: dict,
                    n_features: int = 2, base_resolution: int = 2, max_level_scale: float = 2.0,
                    table_dtype: str = "float32", fill_levels: bool = True) -> dict:
    """One node's HashGrid config for an array of `n_nodes` nodes within `param_budget` parameters in all.

    Levels run from `base_resolution` to `finest_resolution` (`grid_levels_for`); the table is the largest
    2^k entries per level (k in 8..19) with n_nodes * `node_params` <= param_budget. With `fill_levels`, what
    the power-of-two table leaves of the budget goes to more levels between the same resolutions, up to
    MAX_FILL_LEVELS levels and down to a growth of MIN_LEVEL_SCALE per level: a single grid of the same memory
    has 16 levels, and a spent budget measured better than an unused one (docs/design-notes.md, octree quality).
    A budget too small for the smallest table is an error naming the least budget that fits."""
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise ConfigError(f"n_nodes={n_nodes!r} must be an integer >= 1")
    if isinstance(param_budget, bool) or not isinstance(param_budget, int) or param_budget < 1:
        raise ConfigError(f"param_budget={param_budget!r} must be an integer >= 1")
    if not isinstance(fill_levels, bool):
        raise ConfigError(f"fill_levels={fill_levels!r} must be True or False")
    n_levels, scale = grid_levels_for(finest_resolution, base_resolution, max_level_scale)
    best = None
    for log2 in range(MIN_LOG2_HASHMAP, MAX_LOG2_HASHMAP + 1):
        encoding = {"otype": "HashGrid", "n_levels": n_levels, "n_features_per_level": n_features,
                    "log2_hashmap_size": log2, "base_resolution": base_resolution, "per_level_scale": scale,
                    "table_dtype": table_dtype}
        if n_nodes * node_params(encoding, network) > param_budget:
            break
        best = encoding
    if best is None:
        least = n_nodes * node_params(dict(encoding, log2_hashmap_size=MIN_LOG2_HASHMAP), network)
        raise ConfigError(f"param_budget={param_budget} cannot hold {n_nodes} nodes of {n_levels} grid levels; "
                          f"allowed: >= {least}")
    if fill_levels and best["n_levels"] > 1:
        top = best["base_resolution"] * best["per_level_scale"] ** (best["n_levels"] - 1)
        while True:
            more = best["n_levels"] + 1
            scale = (top / best["base_resolution"]) ** (1.0 / (more - 1))
            candidate = dict(best, n_levels=more, per_level_scale=scale)
            if (more > MAX_FILL_LEVELS or scale < MIN_LEVEL_SCALE
                    or n_nodes * node_params(candidate, network) > param_budget):
                break
            best = candidate
    return best


def single_grid_params(finest_resolution: int, n_levels: int = 16, log2_hashmap_size: int = 19,
                       base_resolution: int = 16, n_features: int = 2) -> int:
    """Grid parameters of one hash grid over the whole box (the single-grid teacher's table)."""
    from ...encodings.grid_layout import grid_layout

    scale = math.exp(math.log(finest_resolution / base_resolution) / max(n_levels - 1, 1))
    return grid_layout(3, n_levels, n_features, log2_hashmap_size, base_resolution, scale, "Hash").n_params



class BudgetedOctree(NamedTuple):
    tree: object            # tinn.scenes.acceleration.octree.Octree
    encoding: dict          # every node's HashGrid config
    lod_resolution: float   # the level rule's cells per node edge (OctreeField's lod_resolution)
    depth: int              # the depth limit the capture allowed (the tree may stop above it where nodes are empty)


def budgeted_octree(images, param_budget: int, network: dict, max_depth: int = 16,
                    min_leaf_resolution: float = DEFAULT_MIN_LEAF_RESOLUTION, min_points: int = 8,
                    oversample: float = 2.0, points=None, lod_resolution: float | None = None,
                    footprint: float | None = None, per_node: bool = False,
                    **encoding_options) -> BudgetedOctree:
    """The octree and node grid of posed images within `param_budget` parameters: the tree as deep as the
    capture feeds (`capture_depth`, at most `max_depth`; `min_leaf_resolution` 0 leaves `max_depth` alone),
    built over `points` or else the views' visual hull (`octree_over`); the level rule's cells per node edge
    from the closest view's footprint (`footprint`, default `closest_footprint(images)`; a capture with
    close-ups passes `surface_footprint`) through `leaf_resolution`, unless `lod_resolution` is given; each node's
    grid `oversample` times finer than that, its levels and table from the budget (`budget_encoding`, which takes
    `encoding_options`: n_features, base_resolution, max_level_scale, table_dtype, fill_levels). `per_node`: the
    budget is each node's, so the array grows with the tree (a preset that shows what more nodes buy)."""
    from ..training.octree_training import octree_over
    from .octree import cube_around

    if not (isinstance(oversample, (int, float)) and math.isfinite(oversample) and oversample > 0):
        raise ConfigError(f"oversample={oversample!r} must be a number > 0")
    if footprint is None:
        footprint = closest_footprint(images)
    elif not (isinstance(footprint, (int, float)) and math.isfinite(footprint) and footprint > 0):
        raise ConfigError(f"footprint={footprint!r} must be a finite number > 0")
    depth = max_depth
    if min_leaf_resolution > 0:
        edge = cube_around(images.box_min.float(), images.box_max.float())[1]
        depth = min(max_depth, capture_depth(edge, footprint, min_leaf_resolution))
    tree = octree_over(images, depth, min_points, points)
    rule = leaf_resolution(tree, footprint) if lod_resolution is None else float(lod_resolution)
    total = param_budget * tree.n_nodes if per_node and isinstance(param_budget, int) else param_budget
    encoding = budget_encoding(tree.n_nodes, total, rule * oversample, network, **encoding_options)
    return BudgetedOctree(tree, encoding, rule, depth)

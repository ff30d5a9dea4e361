"""A radiance field made of one tiny network per octree node (InfNeRF-style level of detail).

Every node of an `Octree` owns a multiresolution grid and a small MLP, all held by one
`NetworkWithInputEncoding` array (network id == node id). A node sees its own cube mapped to
[0, 1]^3 and outputs (density, colour); coarse nodes learn low-pass versions of the scene because
only samples with large footprints are routed to them.

Each sample picks its node by footprint: radius r = t * pixel_radius, level = floor(log2(root_size / r))
with root_size = root edge / `lod_resolution` (the root's grid spacing, so a node is chosen where its
grid cells are about as wide as the sample), then `Octree.lookup` descends to that level (clamped to the
deepest node; -1 in empty space). Only samples that land in a node are evaluated, so a frame touches
only the networks along its rays; `render_rays` reports which.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .. import checks
from ..errors import ConfigError, InputError
from ..models import NetworkWithInputEncoding
from ..render import camera_rays, composite, pack, pixel_radius, ray_box, stratified_t
from .octree import Octree, levels_for_radius
from .fields import density_activation

DEFAULT_ENCODING = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12,
                    "base_resolution": 2, "per_level_scale": 2.0}
DEFAULT_NETWORK = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                   "n_neurons": 32, "n_hidden_layers": 1}
DENSITY_BIAS = -1.0  # exp(raw - 1): starts nearly transparent so early gradients reach every sample


class RayBatchResult(NamedTuple):
    rgb: torch.Tensor               # (R, 3) composited colour
    opacity: torch.Tensor           # (R,)
    node_ids: torch.Tensor          # (M,) int32: the node of every evaluated sample
    ray_offsets: torch.Tensor       # (R + 1,) int32: ray r owns node_ids[ray_offsets[r]:ray_offsets[r + 1]]


def finest_grid_resolution(encoding_config: dict) -> Optional[float]:
    """Cells per axis of the finest grid level (base * scale^(levels-1)), or None for non-grid encodings."""
    if "Grid" not in str(encoding_config.get("otype", "")):
        return None
    base = float(encoding_config.get("base_resolution", 16))
    levels = int(encoding_config.get("n_levels", 16))
    scale = float(encoding_config.get("per_level_scale", 2.0))
    return base * scale ** (levels - 1)


class OctreeField(torch.nn.Module):
    """Density + colour of a scene from one network per octree node.

    octree: the node layout (`Octree.build`). encoding_config / network_config: tcnn-style configs of each
    node's model (defaults: a small dense-sized hash grid and a 32-wide MLP). lod_resolution: grid cells per
    node edge used by the level rule (default: the finest grid level's resolution; 1 makes node size itself
    match the footprint).
    """

    def __init__(self, octree: Octree, encoding_config: dict | None = None, network_config: dict | None = None,
                 lod_resolution: float | None = None, seed: int = 1337):
        super().__init__()
        if not isinstance(octree, Octree):
            raise InputError(f"octree must be an Octree, got {type(octree).__name__}")
        self.octree = octree
        self.encoding_config = dict(encoding_config or DEFAULT_ENCODING)
        self.network_config = dict(network_config or DEFAULT_NETWORK)
        if lod_resolution is None:
            lod_resolution = finest_grid_resolution(self.encoding_config) or 1.0
        if not (isinstance(lod_resolution, (int, float)) and math.isfinite(lod_resolution) and lod_resolution > 0):
            raise ConfigError(f"lod_resolution={lod_resolution!r} must be a number > 0")
        self.lod_resolution = float(lod_resolution)
        self.model = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config,
                                              n_networks=octree.n_nodes, seed=seed)

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self.octree.n_nodes

    @property
    def lod_root_size(self) -> float:
        return self.octree.edge / self.lod_resolution

    def params_per_node(self) -> int:
        return sum(p.numel() for p in self.model.parameters()) // self.n_nodes

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    # ---- per-sample queries --------------------------------------------------------------------------
    def select_nodes(self, points: torch.Tensor, sample_radius: torch.Tensor) -> torch.Tensor:
        """Node id (int32) of every point for its footprint radius; -1 for empty space or outside the box."""
        return self.octree.lookup(points, levels_for_radius(sample_radius, self.lod_root_size))

    def query(self, points: torch.Tensor, node_ids: torch.Tensor):
        """(sigma (M,), rgb (M, 3)) of points evaluated by their nodes' networks (ids must all be >= 0)."""
        local = self.octree.local_coords(points, node_ids).clamp(0.0, 1.0)
        raw = self.model(local.contiguous(), node_ids)
        return density_activation(raw[:, 0] + DENSITY_BIAS), torch.sigmoid(raw[:, 1:4])

    # ---- rays ----------------------------------------------------------------------------------------
    def render_rays(self, origins: torch.Tensor, directions: torch.Tensor, pixel_radius, n_samples: int,
                    jitter: bool = False, background: torch.Tensor | None = None,
                    generator: torch.Generator | None = None) -> RayBatchResult:
        """Composite rays through the field; gradients flow to the node networks.

        pixel_radius: a float, or an (R,) tensor (rays from several pyramid levels in one batch).
        """
        n_rays = origins.shape[0]
        if isinstance(pixel_radius, torch.Tensor):
            if pixel_radius.shape != (n_rays,):
                raise InputError(f"pixel_radius must be a float or have shape ({n_rays},), got "
                                 f"{tuple(pixel_radius.shape)}")
            radius = pixel_radius.float()[:, None]
        else:
            if not (isinstance(pixel_radius, (int, float)) and pixel_radius > 0):
                raise InputError(f"pixel_radius={pixel_radius!r} must be a number > 0")
            radius = float(pixel_radius)
        t_near, t_far = ray_box(origins, directions, self.octree.box_min, self.octree.box_max)
        t, deltas = stratified_t(t_near, t_far, n_samples, jitter, generator)
        points = (origins[:, None, :] + t[..., None] * directions[:, None, :]).reshape(-1, 3)
        ids = self.select_nodes(points, (t * radius).reshape(-1))
        keep = (ids >= 0).view(n_rays, -1) & (deltas > 0)
        sample_index, ray_offsets = pack(keep)
        node_ids = ids[sample_index]
        with checks.disabled():  # ids come from the octree: in range by construction
            sigma, rgb = self.query(points[sample_index], node_ids)
        out = composite(sigma, rgb, deltas.reshape(-1)[sample_index].contiguous(), ray_offsets, background)
        return RayBatchResult(out.rgb, out.opacity, node_ids, ray_offsets)

    @torch.no_grad()
    def render_image(self, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int,
                     background: torch.Tensor | None = None, chunk: int = 1 << 14) -> dict:
        """Render one view in chunks of rays. Returns image (H, W, 3), first_node (H, W) (the node met first along
        each pixel's ray, -1 for none) and touched (sorted distinct node ids evaluated for the frame)."""
        origins, directions = camera_rays(c2w, width, height, focal)
        radius = pixel_radius(focal)
        colors, firsts, touched = [], [], []
        for start in range(0, origins.shape[0], chunk):
            res = self.render_rays(origins[start:start + chunk], directions[start:start + chunk], radius, n_samples,
                                   background=background)
            colors.append(res.rgb)
            firsts.append(first_node_per_ray(res.node_ids, res.ray_offsets))
            touched.append(torch.unique(res.node_ids))
        touched = torch.unique(torch.cat(touched)) if touched else torch.zeros(0, dtype=torch.int32)
        return {"image": torch.cat(colors).view(height, width, 3), "first_node": torch.cat(firsts).view(height, width),
                "touched": touched}

    def touched_report(self, touched: torch.Tensor) -> dict:
        """Distinct nodes and parameters a frame evaluated, against the whole array; nodes touched per depth."""
        n = int(touched.numel())
        depths = self.octree.depth[touched.long()]
        per_depth = torch.bincount(depths.long(), minlength=self.octree.deepest + 1).tolist()
        return {"nodes_touched": n, "nodes_total": self.n_nodes, "params_touched": n * self.params_per_node(),
                "params_total": self.n_params(), "fraction_touched": n / self.n_nodes,
                "nodes_touched_per_depth": per_depth}


def first_node_per_ray(node_ids: torch.Tensor, ray_offsets: torch.Tensor) -> torch.Tensor:
    """The node of each ray's first evaluated sample, -1 for rays with none."""
    starts, ends = ray_offsets[:-1].long(), ray_offsets[1:].long()
    has = ends > starts
    out = torch.full(starts.shape, -1, dtype=torch.int32, device=node_ids.device)
    out[has] = node_ids[starts[has]]
    return out


def photometric_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over rays and channels (L2)."""
    return F.mse_loss(predicted, target)

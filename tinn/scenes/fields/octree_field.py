"""A radiance field made of one tiny network per octree node (InfNeRF-style level of detail).

Every node of an `Octree` owns a multiresolution grid and a small MLP, all held by one
`NetworkWithInputEncoding` array (network id == node id). A node sees its own cube mapped to
[0, 1]^3 and outputs (density, colour); coarse nodes learn low-pass versions of the scene because
only samples with large footprints are routed to them.

Each sample picks its node by footprint: radius r = t * pixel_radius, level = floor(log2(root_size / r))
with root_size = root edge / `lod_resolution` (the root's grid spacing, so a node is chosen where its
grid cells are about as wide as the sample), then the walk down the octree to that level (clamped to the
deepest node; -1 in empty space). Only samples that land in a node are evaluated, so a frame touches
only the networks along its rays; `render_rays` reports which.

Rendering the field (`render_rays`, `render_image`) is tinn/render/octree.py's; `build_occupancy` makes the
occupancy grids per octree depth its `render_image` skips empty space with.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from ...errors import ConfigError, InputError
from ...models import NetworkWithInputEncoding
from ...render import octree as octree_rendering
from ..acceleration.octree import Octree, levels_for_radius
from ..acceleration.occupancy import OccupancyGrid
from ..acceleration.octree_occupancy import LevelOccupancy
from .radiance import density_activation

DEFAULT_ENCODING = {"otype": "HashGrid", "n_levels": 4, "n_features_per_level": 2, "log2_hashmap_size": 12,
                    "base_resolution": 2, "per_level_scale": 2.0}
DEFAULT_NETWORK = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                   "n_neurons": 32, "n_hidden_layers": 1}
# Samples per call of the node array: one run of a frame can hold tens of millions of samples (800 px, 256 samples
# a ray), and the array's per-sample buffers (features, activations: up to 128 values a sample) must stay within
# one kernel's 32-bit index (`tinn.chunks.check_batch`).
QUERY_PIECE = 1 << 23
DENSITY_BIAS = -1.0  # exp(raw - 1): starts nearly transparent so early gradients reach every sample


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
    match the footprint). hull: where the scene can be (`visual_hull(images)`, an OccupancyGrid over the octree's
    box, or None): no sample outside it is evaluated, in training or in rendering, so the field is defined inside
    it only; an `occupancy` used for rendering skips more, never less. shared_decoder: one MLP for every node,
    each node keeping its own grid (`NetworkWithInputEncoding(share_network=True)`): every sample trains the
    decoder, where a node's own MLP learns only from the rays that reach it.
    """

    def __init__(self, octree: Octree, encoding_config: dict | None = None, network_config: dict | None = None,
                 lod_resolution: float | None = None, seed: int = 1337, blend_margin: float = 0.0,
                 hull: LevelOccupancy | OccupancyGrid | None = None, shared_decoder: bool = False):
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
        if not (isinstance(blend_margin, (int, float)) and 0.0 <= blend_margin < 0.5):
            raise ConfigError(f"blend_margin={blend_margin!r} must be a number in [0, 0.5)")
        self.blend_margin = float(blend_margin)
        # Samples arrive along their rays, in runs of one node each: grouped by node, a training step's device
        # work grew (one H100, 9 nodes: 3.72 to 4.27 ms; design notes, "Samples grouped by network").
        if shared_decoder not in (True, False):
            raise ConfigError(f"shared_decoder={shared_decoder!r}; allowed: True or False")
        self.shared_decoder = bool(shared_decoder)
        self.model = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config,
                                              n_networks=octree.n_nodes, seed=seed, group_by_network=False,
                                              share_network=self.shared_decoder)
        self.occupancy: LevelOccupancy | OccupancyGrid | None = None  # skipping in render_image (build_occupancy)
        self.hull = hull

    @property
    def hull(self) -> LevelOccupancy | OccupancyGrid | None:
        """The voxels outside which no sample is evaluated (None: the whole box); see the class docstring."""
        return self.__dict__.get("_hull")

    @hull.setter
    def hull(self, grid) -> None:
        if grid is not None:
            octree_rendering.check_grid("hull", self, grid)
        self.__dict__["_hull"] = grid
        self.__dict__["_skipping"] = None  # the grids combined with it (tinn/render/octree.py, skipping_grid)

    # ---- sizes ------------------------------------------------------------------------------------
    @property
    def n_nodes(self) -> int:
        return self.octree.n_nodes

    @property
    def lod_root_size(self) -> float:
        return self.octree.edge / self.lod_resolution

    def params_per_node(self) -> int:
        """Parameters each node owns: its grid table, and its MLP unless the decoder is shared."""
        return self.model.n_params_per_network()

    def shared_params(self) -> int:
        """Parameters every drawn node uses besides its own: the shared decoder's (0 with an MLP per node)."""
        return self._sizes()[2]

    def _sizes(self) -> tuple[int, int, int, int]:
        """(parameters, bytes) each node owns, then (parameters, bytes) of the shared decoder ((0, 0) with an MLP
        per node). Read from the model whose ids are nodes: the field's own, or a sharded field's rank's part
        (`ShardedPart.local`), which holds some of the nodes and a replica of the decoder."""
        model = getattr(self.model, "local", self.model)
        shared = tuple(model.network.parameters()) if self.shared_decoder else ()
        shared_bytes = sum(p.numel() * p.element_size() for p in shared)
        own_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) - shared_bytes
        return (model.n_params_per_network(), own_bytes // max(model.n_networks, 1),
                sum(p.numel() for p in shared), shared_bytes)

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
        return self.query_in_nodes(self.octree.local_coords(points, node_ids).clamp(0.0, 1.0), node_ids)

    def _query_local(self, local: torch.Tensor, node_ids: torch.Tensor):
        n = local.shape[0]
        if n > QUERY_PIECE:
            pieces = [self._query_local(local[a:a + QUERY_PIECE], node_ids[a:a + QUERY_PIECE])
                      for a in range(0, n, QUERY_PIECE)]
            return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])
        raw = self.model(local.contiguous(), node_ids)
        return density_activation(raw[:, 0] + DENSITY_BIAS), torch.sigmoid(raw[:, 1:4])

    def query_in_nodes(self, local: torch.Tensor, node_ids: torch.Tensor):
        """(sigma, rgb) of samples given in their node's local coordinates, blended across node faces when
        `blend_margin` > 0.

        Each node is its own network, so without blending the field jumps at every node border (a seam where two
        fits of the same pixels disagree). Within `blend_margin` of a face, the sample also takes the node across
        that face (the node of the same depth there, or the leaf above it; none where space is pruned): per axis
        the own node weighs 1/2 + d / (2 margin) at distance d from the face, the neighbour the rest, and the
        weights of up to 8 nodes are the products over the axes (renormalised over the nodes that exist). At the
        face both sides weigh 1/2, so the field is continuous across it. Neighbours are evaluated at the same
        point, their local coordinates clamped to their cube."""
        m = self.blend_margin
        if m <= 0.0 or node_ids.numel() == 0:
            return self._query_local(local, node_ids)
        tree = self.octree
        k = tree.kernel_tables
        ids = node_ids.long()
        half = k.half_size[ids][:, None]
        points = k.center[ids] + (2.0 * local - 1.0) * half
        low, high = local < m, local > 1.0 - m
        side = high.to(torch.int64) - low.to(torch.int64)                  # (M, 3): face the sample is near
        dist = torch.where(low, local, 1.0 - local)
        own = torch.where(side != 0, 0.5 + dist / (2.0 * m), torch.ones_like(local))   # own node's weight per axis
        band = torch.nonzero((side != 0).any(dim=1)).squeeze(1)
        rows, nodes, weights = [torch.arange(ids.shape[0], device=ids.device)], [ids], [own.prod(dim=1)]
        depth = k.depth[ids[band]]
        for subset in range(1, 8):
            axes = torch.tensor([(subset >> a) & 1 for a in range(3)], dtype=torch.bool, device=ids.device)
            s = side[band]
            take = (s[:, axes] != 0).all(dim=1)
            if not bool(take.any()):
                continue
            b = band[take]
            shift = (s[take] * axes.to(torch.int64)).to(points.dtype) * (2.0 * half[b])
            neighbour = tree.lookup((points[b] + shift).contiguous(), depth[take]).long()
            w = torch.where(axes, 1.0 - own[b], own[b]).prod(dim=1)
            keep = neighbour >= 0
            rows.append(b[keep]), nodes.append(neighbour[keep]), weights.append(w[keep])
        rows, nodes, weights = torch.cat(rows), torch.cat(nodes), torch.cat(weights)
        local_n = ((points[rows] - k.center[nodes]) / (2.0 * k.half_size[nodes][:, None]) + 0.5).clamp(0.0, 1.0)
        sigma_n, rgb_n = self._query_local(local_n, nodes.to(torch.int32))
        total = torch.zeros(ids.shape[0], device=ids.device).index_add_(0, rows, weights)
        w = weights / total[rows]
        sigma = torch.zeros(ids.shape[0], device=ids.device, dtype=sigma_n.dtype).index_add(0, rows, w * sigma_n)
        rgb = torch.zeros(ids.shape[0], 3, device=ids.device, dtype=rgb_n.dtype).index_add(0, rows,
                                                                                          w[:, None] * rgb_n)
        return sigma, rgb

    def build_occupancy(self, resolution: int, n_samples: int, alpha_threshold: float = 0.01, n_jitter: int = 4,
                        dilate: int = 1) -> LevelOccupancy:
        """Occupancy grids over the octree's box, one per depth (`LevelOccupancy`): voxels where one render step
        (the longest: box diagonal / n_samples) through the densest point found reaches `alpha_threshold`, within
        the field's hull. Set it as `field.occupancy` for `render_image` to skip the other voxels."""
        if not 0.0 < float(alpha_threshold) < 1.0:
            raise ConfigError(f"alpha_threshold={alpha_threshold!r} must be in (0, 1)")
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ConfigError(f"n_samples={n_samples!r} must be an integer >= 1")
        step = float((self.octree.box_max - self.octree.box_min).norm()) / n_samples
        threshold = -math.log1p(-float(alpha_threshold)) / step
        occupancy = LevelOccupancy.from_field(self, resolution, threshold, n_jitter=n_jitter, dilate=dilate)
        if self.hull is None:
            return occupancy
        # Outside its hull the field is undefined (never trained): those voxels stay empty.
        from ..acceleration.visual_hull import within_hull
        return within_hull(occupancy, self.hull)

    # ---- rays (tinn/render/octree.py renders the field) ------------------------------------------------
    def assign(self, origins: torch.Tensor, directions: torch.Tensor, t: torch.Tensor, deltas: torch.Tensor,
               radius: torch.Tensor, occupancy: LevelOccupancy | OccupancyGrid | None = None):
        """`tinn.render.octree.assign_nodes` of this field: every sample's node and local coordinates."""
        return octree_rendering.assign_nodes(self, origins, directions, t, deltas, radius, occupancy)

    def render_rays(self, origins: torch.Tensor, directions: torch.Tensor, pixel_radius, n_samples: int,
                    jitter: bool = False, background: torch.Tensor | None = None,
                    generator: torch.Generator | None = None,
                    occupancy: LevelOccupancy | OccupancyGrid | None = None) -> octree_rendering.RayBatchResult:
        """`tinn.render.octree.render_rays` of this field: rays composited, gradients to the node networks."""
        return octree_rendering.render_rays(self, origins, directions, pixel_radius, n_samples, jitter, background,
                                            generator, occupancy)

    def render_image(self, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int,
                     background: torch.Tensor | None = None, chunk: int = 1 << 20, occupancy="auto",
                     early_stop: float = 1e-4, segments: int = 2, supersample="auto",
                     footprint_focal: float | None = None) -> dict:
        """`tinn.render.octree.render_image` of this field: one view, its first nodes and the nodes it touched."""
        return octree_rendering.render_image(self, c2w, width, height, focal, n_samples, background, chunk, occupancy,
                                             early_stop, segments, supersample, footprint_focal)

    def touched_report(self, touched: torch.Tensor) -> dict:
        """Distinct nodes and parameters a frame evaluated, against the whole array; nodes touched per depth."""
        n = int(touched.numel())
        depths = self.octree.depth[touched.long()]
        per_depth = torch.bincount(depths.long(), minlength=self.octree.deepest + 1).tolist()
        # Totals over every node (a sharded field's ranks each hold some), the shared decoder counted once and
        # touched by any frame that touches a node.
        node_params, node_bytes, shared_params, shared_bytes = self._sizes()
        params = n * node_params + (shared_params if n else 0)
        params_total = self.n_nodes * node_params + shared_params
        return {"nodes_touched": n, "nodes_total": self.n_nodes, "params_touched": params,
                "params_total": params_total, "fraction_touched": params / params_total,
                "param_bytes_touched": n * node_bytes + (shared_bytes if n else 0),
                "param_bytes_total": self.n_nodes * node_bytes + shared_bytes,
                "nodes_touched_per_depth": per_depth}


def photometric_loss(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over rays and channels (L2)."""
    return F.mse_loss(predicted, target)

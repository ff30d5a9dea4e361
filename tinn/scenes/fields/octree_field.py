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

A batch of rays is rendered as: one Taichi kernel assigns every sample its node (level, walk, occupancy
test, local coordinates; `tinn.kernels.octree.assign_samples`), the assigned samples are packed, the node
array evaluates them in one call (ragged routing by node id), and one compositing pass finishes the rays.
`render_image` marches the rays instead (`tinn.kernels.octree.march_count` / `march_emit`: only samples
that have a node are produced), adds empty-space skipping (an occupancy grid per octree depth,
`build_occupancy`) and early ray termination: the samples of a ray are taken in `segments` runs front to
back, and rays whose transmittance fell below `early_stop` are dropped from the later runs.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ... import checks
from ...errors import ConfigError, InputError
from ...models import NetworkWithInputEncoding
from ...render import camera_rays, composite, frame_runs, pack, pixel_radius, ray_box, stratified_t
from ..acceleration.octree import Octree, levels_for_radius
from ..acceleration.occupancy import OccupancyGrid
from ..acceleration.octree_occupancy import LevelOccupancy
from .radiance import density_activation

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
                 lod_resolution: float | None = None, seed: int = 1337, blend_margin: float = 0.0):
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
        self.model = NetworkWithInputEncoding(3, 4, self.encoding_config, self.network_config,
                                              n_networks=octree.n_nodes, seed=seed)
        self.occupancy: LevelOccupancy | OccupancyGrid | None = None  # skipping in render_image (build_occupancy)

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
        return self._query_nodes(self.octree.local_coords(points, node_ids).clamp(0.0, 1.0), node_ids)

    def _query_local(self, local: torch.Tensor, node_ids: torch.Tensor):
        raw = self.model(local.contiguous(), node_ids)
        return density_activation(raw[:, 0] + DENSITY_BIAS), torch.sigmoid(raw[:, 1:4])

    def _query_nodes(self, local: torch.Tensor, node_ids: torch.Tensor):
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
        (the longest: box diagonal / n_samples) through the densest point found reaches `alpha_threshold`. Set
        it as `field.occupancy` for `render_image` to skip the other voxels."""
        if not 0.0 < float(alpha_threshold) < 1.0:
            raise ConfigError(f"alpha_threshold={alpha_threshold!r} must be in (0, 1)")
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ConfigError(f"n_samples={n_samples!r} must be an integer >= 1")
        step = float((self.octree.box_max - self.octree.box_min).norm()) / n_samples
        threshold = -math.log1p(-float(alpha_threshold)) / step
        return LevelOccupancy.from_field(self, resolution, threshold, n_jitter=n_jitter, dilate=dilate)

    # ---- rays ----------------------------------------------------------------------------------------
    def _occupancy_args(self, occupancy):
        """(flat uint8 voxels, resolution, number of grids) for the kernel; resolution 0 means no skipping."""
        tree = self.octree
        if occupancy is None:
            return torch.zeros(1, dtype=torch.uint8, device=tree.device), 0, 1
        if not isinstance(occupancy, (OccupancyGrid, LevelOccupancy)):
            raise InputError(f"occupancy must be a LevelOccupancy, an OccupancyGrid or None, got "
                             f"{type(occupancy).__name__}")
        if not (torch.equal(occupancy.box_min.to(tree.device), tree.box_min)
                and torch.equal(occupancy.box_max.to(tree.device), tree.box_max)):
            raise InputError(f"the occupancy grid covers [{occupancy.box_min.tolist()}, {occupancy.box_max.tolist()}]"
                             f"; it must cover the octree's box [{tree.box_min.tolist()}, {tree.box_max.tolist()}]")
        grids = occupancy.depths if isinstance(occupancy, LevelOccupancy) else 1
        return occupancy.occupied.reshape(-1).view(torch.uint8), occupancy.resolution, grids

    def assign(self, origins: torch.Tensor, directions: torch.Tensor, t: torch.Tensor, deltas: torch.Tensor,
               radius: torch.Tensor, occupancy: LevelOccupancy | OccupancyGrid | None = None):
        """Node of every sample (R, S) int32, -1 where nothing is evaluated (delta 0, outside the box, pruned
        space, an empty voxel of `occupancy`), and local coordinates (R * S, 3) (rows of assigned samples only).

        Sample (r, s) is origins[r] + t[r, s] directions[r] with footprint radius t[r, s] * radius[r]."""
        from ...kernels import octree as octree_kernels

        n_rays, n_samples = t.shape
        dev = t.device
        node = torch.empty(n_rays, n_samples, dtype=torch.int32, device=dev)
        local = torch.empty(n_rays * n_samples, 3, dtype=torch.float32, device=dev)
        if node.numel():
            k = self.octree.kernel_tables
            occupied, occ_res, grids = self._occupancy_args(occupancy)
            octree_kernels.assign_samples(origins.contiguous(), directions.contiguous(), t.contiguous(), deltas.contiguous(),
                             radius.contiguous(), k.children, k.split, k.depth, k.center, k.half_size,
                             k.geometry(occupancy), self.lod_root_size, self.octree.max_depth, self.octree.deepest,
                             occupied, occ_res, grids, node, local)
        return node, local

    def _evaluate(self, origins, directions, t, deltas, radius, occupancy):
        """Assign, pack and evaluate one batch of samples: (sigma, rgb, deltas, node_ids, ray_offsets), packed."""
        node, local = self.assign(origins, directions, t, deltas, radius, occupancy)
        sample_index, ray_offsets = pack(node >= 0)
        node_ids = node.reshape(-1)[sample_index]
        with checks.disabled():  # ids come from the octree: in range by construction
            sigma, rgb = self._query_nodes(local[sample_index], node_ids)
        return sigma, rgb, deltas.reshape(-1)[sample_index].contiguous(), node_ids, ray_offsets

    def _ray_radius(self, pixel_radius, n_rays: int, dev) -> torch.Tensor:
        if isinstance(pixel_radius, torch.Tensor):
            if pixel_radius.shape != (n_rays,):
                raise InputError(f"pixel_radius must be a float or have shape ({n_rays},), got "
                                 f"{tuple(pixel_radius.shape)}")
            return pixel_radius.float().contiguous()
        if not (isinstance(pixel_radius, (int, float)) and pixel_radius > 0):
            raise InputError(f"pixel_radius={pixel_radius!r} must be a number > 0")
        return torch.full((n_rays,), float(pixel_radius), device=dev)

    def render_rays(self, origins: torch.Tensor, directions: torch.Tensor, pixel_radius, n_samples: int,
                    jitter: bool = False, background: torch.Tensor | None = None,
                    generator: torch.Generator | None = None,
                    occupancy: LevelOccupancy | OccupancyGrid | None = None) -> RayBatchResult:
        """Composite rays through the field; gradients flow to the node networks.

        pixel_radius: a float, or an (R,) tensor (rays from several pyramid levels in one batch). With an
        `occupancy` grid, samples in its empty voxels are not evaluated.
        """
        radius = self._ray_radius(pixel_radius, origins.shape[0], origins.device)
        t_near, t_far = ray_box(origins, directions, self.octree.box_min, self.octree.box_max)
        t, deltas = stratified_t(t_near, t_far, n_samples, jitter, generator)
        sigma, rgb, d, node_ids, ray_offsets = self._evaluate(origins, directions, t, deltas, radius, occupancy)
        out = composite(sigma, rgb, d, ray_offsets, background)
        return RayBatchResult(out.rgb, out.opacity, node_ids, ray_offsets)

    @torch.no_grad()
    def render_image(self, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int,
                     background: torch.Tensor | None = None, chunk: int = 1 << 20, occupancy="auto",
                     early_stop: float = 1e-4, segments: int = 2) -> dict:
        """Render one view. Returns image (H, W, 3), first_node (H, W) (the node met first along each pixel's ray,
        -1 for none), touched (sorted distinct node ids evaluated for the frame) and n_evaluated (samples the
        networks evaluated).

        The samples are `render_rays`' without jitter, produced by a marching kernel pair (count, prefix sum,
        emit: only samples that have a node, nothing of size rays x samples). occupancy: "auto" (the field's
        `occupancy`, if set), None (no skipping), a LevelOccupancy or an OccupancyGrid. Early ray termination:
        a ray's bins are taken in `segments` runs, and a ray whose transmittance is below `early_stop` after a
        run is finished there (its image changes by at most `early_stop`); segments=1 or early_stop=0 evaluates
        every sample in one run. `chunk`: rays marched at once.
        """
        if isinstance(occupancy, str):
            if occupancy != "auto":
                raise InputError(f"occupancy={occupancy!r}; allowed: 'auto', None, a LevelOccupancy or an OccupancyGrid")
            occupancy = self.occupancy
        runs = frame_runs(n_samples, segments, early_stop, chunk)
        origins, directions = camera_rays(c2w, width, height, focal)
        dev, n_rays = origins.device, origins.shape[0]
        bg = torch.zeros(3, device=dev) if background is None else torch.as_tensor(background).to(dev).float()
        if bg.shape != (3,):
            raise InputError(f"background must have shape (3,), got {tuple(bg.shape)}")
        radius = self._ray_radius(pixel_radius(focal), n_rays, dev)
        t_near, t_far = ray_box(origins, directions, self.octree.box_min, self.octree.box_max)
        touched = torch.zeros(self.n_nodes, dtype=torch.int64, device=dev)  # evaluated samples per node
        color = torch.zeros(n_rays, 3, device=dev)
        trans = torch.ones(n_rays, device=dev)
        first = torch.full((n_rays,), -1, dtype=torch.int32, device=dev)
        # Finished rays stay in the list and march no samples (no compaction, no sync for it).
        with checks.disabled():  # node ids, points and offsets come from the octree and the marcher
            for start in range(0, n_rays, chunk):
                end = min(start + chunk, n_rays)
                rays = torch.arange(start, end, dtype=torch.int32, device=dev)
                for a, b in runs:
                    node_ids, local, deltas, offsets = self._march(origins, directions, t_near, t_far, radius, rays,
                                                                   a, b, n_samples, occupancy, trans, early_stop)
                    touched += torch.bincount(node_ids, minlength=self.n_nodes)
                    if node_ids.numel():
                        sigma, rgb = self._query_nodes(local, node_ids)
                    else:
                        sigma, rgb = torch.zeros(0, device=dev), torch.zeros(0, 3, device=dev)
                    out = composite(sigma, rgb, deltas, offsets)  # black: the background goes behind every run
                    color[start:end] += trans[start:end, None] * out.rgb
                    trans[start:end] *= 1.0 - out.opacity
                    seen = first[start:end]
                    first[start:end] = torch.where(seen >= 0, seen, first_node_per_ray(node_ids, offsets))
        image = color + trans[:, None] * bg
        return {"image": image.view(height, width, 3), "first_node": first.view(height, width),
                "touched": torch.nonzero(touched).squeeze(1).to(torch.int32), "n_evaluated": int(touched.sum())}

    def _march(self, origins, directions, t_near, t_far, radius, rays, first_bin, end_bin, n_samples, occupancy,
               trans, early_stop):
        """Packed samples of bins first_bin..end_bin-1 of the listed rays that have a node (none for rays whose
        transmittance `trans` is at most early_stop > 0): node ids, local coordinates, bin lengths and ray
        offsets (len(rays) + 1, int32)."""
        from ...kernels import octree as octree_kernels

        dev = origins.device
        k = self.octree.kernel_tables
        occupied, occ_res, grids = self._occupancy_args(occupancy)
        geo = k.geometry(occupancy)
        cutoff = float(early_stop) if early_stop > 0 else -1.0
        head = (origins.contiguous(), directions.contiguous(), t_near.contiguous(), t_far.contiguous(),
                radius.contiguous(), trans.contiguous(), cutoff, rays.contiguous(), int(first_bin), int(end_bin), int(n_samples), k.children,
                k.split, k.depth)
        tail = (self.lod_root_size, self.octree.max_depth, self.octree.deepest, occupied, occ_res, grids)
        offsets = torch.zeros(rays.shape[0] + 1, dtype=torch.int32, device=dev)
        if rays.shape[0]:
            counts = torch.empty(rays.shape[0], dtype=torch.int32, device=dev)
            octree_kernels.march_count(*head, geo, *tail, counts)
            torch.cumsum(counts, 0, out=offsets[1:])
        m = int(offsets[-1])
        node_ids = torch.empty(m, dtype=torch.int32, device=dev)
        local = torch.empty(m, 3, device=dev)
        deltas = torch.empty(m, device=dev)
        if m:
            octree_kernels.march_emit(*head, k.center, k.half_size, geo, *tail, offsets, node_ids, local, deltas)
        return node_ids, local, deltas, offsets

    def touched_report(self, touched: torch.Tensor) -> dict:
        """Distinct nodes and parameters a frame evaluated, against the whole array; nodes touched per depth."""
        n = int(touched.numel())
        depths = self.octree.depth[touched.long()]
        per_depth = torch.bincount(depths.long(), minlength=self.octree.deepest + 1).tolist()
        return {"nodes_touched": n, "nodes_total": self.n_nodes, "params_touched": n * self.params_per_node(),
                "params_total": self.n_params(), "fraction_touched": n / self.n_nodes,
                "param_bytes_touched": n * (self.memory_bytes() // self.n_nodes),
                "param_bytes_total": self.memory_bytes(),
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

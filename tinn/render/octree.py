"""Rendering an `OctreeField` (tinn/scenes/fields/octree_field.py): every sample takes the node its footprint
picks, and only samples that land in a node are evaluated.

`render_rays` (training): stratified samples, one Taichi kernel assigns every sample its node (level, walk,
occupancy test, local coordinates; `tinn.kernels.octree.assign_samples`), the assigned samples are packed, the
node array evaluates them in one call (ragged routing by node id), and one compositing pass finishes the rays. It
is `assign_rays` then `shade_assigned`: a training step can assign its next batch before evaluating its own, so
that the number of assigned samples (which sizes the evaluation) reaches the host without the host waiting.
`render_image` (viewing) marches the rays instead (`tinn.kernels.octree.march_count` / `march_emit`: only
samples that have a node are produced), with empty-space skipping (an occupancy grid per octree depth) and early
ray termination: the samples of a ray are taken in `segments` runs front to back, and rays whose transmittance
fell below `early_stop` are dropped from the later runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from .. import checks
from ..errors import InputError
from .compositing import composite
from .rays import camera_rays, pixel_radius, ray_box
from .pending import PendingCount
from .sampling import frame_runs, positions, ray_offsets, stratified_t

if TYPE_CHECKING:
    from ..scenes.acceleration.occupancy import OccupancyGrid
    from ..scenes.acceleration.octree_occupancy import LevelOccupancy

__all__ = ["RayBatchResult", "AssignedRays", "render_rays", "assign_rays", "split_assigned", "shade_assigned",
           "render_image", "supersample_for", "assign_nodes", "first_node_per_ray"]


class RayBatchResult(NamedTuple):
    rgb: torch.Tensor               # (R, 3) composited colour
    opacity: torch.Tensor           # (R,)
    node_ids: torch.Tensor          # (M,) int32: the node of every evaluated sample
    ray_offsets: torch.Tensor       # (R + 1,) int32: ray r owns node_ids[ray_offsets[r]:ray_offsets[r + 1]]


def check_grid(name: str, field, grid) -> None:
    """`grid` must be an occupancy grid (LevelOccupancy or OccupancyGrid) over the field's octree box."""
    from ..scenes.acceleration.occupancy import OccupancyGrid
    from ..scenes.acceleration.octree_occupancy import LevelOccupancy

    tree = field.octree
    if not isinstance(grid, (OccupancyGrid, LevelOccupancy)):
        raise InputError(f"{name} must be a LevelOccupancy, an OccupancyGrid or None, got {type(grid).__name__}")
    if not (torch.equal(grid.box_min.to(tree.device), tree.box_min)
            and torch.equal(grid.box_max.to(tree.device), tree.box_max)):
        raise InputError(f"the {name} grid covers [{grid.box_min.tolist()}, {grid.box_max.tolist()}]"
                         f"; it must cover the octree's box [{tree.box_min.tolist()}, {tree.box_max.tolist()}]")


def skipping_grid(field, occupancy):
    """The grid the kernels skip samples by: `occupancy` within the field's hull (`OctreeField.hull`), the hull
    alone for no occupancy, `occupancy` alone for a field without one. The combination is made once per pair of
    grids (and again when either is written in place), so each call costs a lookup."""
    if occupancy is not None:
        check_grid("occupancy", field, occupancy)
    hull = getattr(field, "hull", None)
    if hull is None or occupancy is None or occupancy is hull:
        return occupancy if occupancy is not None else hull
    # The grids and their voxel tensors by identity, the tensors' in-place write counts by value.
    grids = (occupancy, occupancy.occupied, hull, hull.occupied)
    versions = (occupancy.occupied._version, hull.occupied._version)
    kept = field.__dict__.get("_skipping")
    if kept is None or kept[1] != versions or any(a is not b for a, b in zip(kept[0], grids)):
        from ..scenes.acceleration.visual_hull import within_hull

        kept = (grids, versions, within_hull(occupancy, hull))
        field.__dict__["_skipping"] = kept
    return kept[2]


def occupancy_arguments(field, occupancy):
    """(flat uint8 voxels, resolution, number of grids) of a grid from `skipping_grid` for the kernel; resolution 0
    means no skipping."""
    tree = field.octree
    if occupancy is None:
        return torch.zeros(1, dtype=torch.uint8, device=tree.device), 0, 1
    from ..scenes.acceleration.octree_occupancy import LevelOccupancy

    grids = occupancy.depths if isinstance(occupancy, LevelOccupancy) else 1
    return occupancy.occupied.reshape(-1).view(torch.uint8), occupancy.resolution, grids


def assign_nodes(field, origins: torch.Tensor, directions: torch.Tensor, t: torch.Tensor, deltas: torch.Tensor,
                 radius: torch.Tensor, occupancy: LevelOccupancy | OccupancyGrid | None = None):
    """Node of every sample (R, S) int32, -1 where nothing is evaluated (delta 0, outside the box, pruned
    space, an empty voxel of `occupancy`), and local coordinates (R * S, 3) (rows of assigned samples only).

    Sample (r, s) is origins[r] + t[r, s] directions[r] with footprint radius t[r, s] * radius[r]."""
    from ..kernels import octree as octree_kernels

    n_rays, n_samples = t.shape
    dev = t.device
    occupancy = skipping_grid(field, occupancy)
    node = torch.empty(n_rays, n_samples, dtype=torch.int32, device=dev)
    local = torch.empty(n_rays * n_samples, 3, dtype=torch.float32, device=dev)
    if node.numel():
        k = field.octree.kernel_tables
        occupied, occ_res, grids = occupancy_arguments(field, occupancy)
        octree_kernels.assign_samples(origins.contiguous(), directions.contiguous(), t.contiguous(),
                                      deltas.contiguous(), radius.contiguous(), k.children, k.split, k.depth,
                                      k.center, k.half_size, k.geometry(occupancy), field.lod_root_size,
                                      field.octree.max_depth, field.octree.deepest, occupied, occ_res, grids, node,
                                      local)
    return node, local


class AssignedRays(NamedTuple):
    """A batch of rays' samples with their nodes (`assign_rays`), not yet gathered or evaluated."""
    node: torch.Tensor          # (R, S) int32: every sample's node, -1 where nothing is evaluated
    local: torch.Tensor         # (R * S, 3) local coordinates in the sample's node
    deltas: torch.Tensor        # (R * S,) bin lengths
    ray_offsets: torch.Tensor   # (R + 1,) int32: ray r owns assigned samples ray_offsets[r]:ray_offsets[r + 1]
    n_assigned: PendingCount    # the number of assigned samples, on its way to the host


def assign_rays(field, origins: torch.Tensor, directions: torch.Tensor, pixel_radius, n_samples: int,
                jitter: bool = False, generator: torch.Generator | None = None,
                occupancy: LevelOccupancy | OccupancyGrid | None = None,
                uniforms: torch.Tensor | None = None) -> AssignedRays:
    """`render_rays`' samples and their nodes, chosen on the device without waiting for it (`shade_assigned`
    evaluates them). The nodes depend on the tree and `occupancy` only, not on the networks' parameters, so a
    batch may be assigned a step ahead of its evaluation, and several batches at once (`split_assigned`).
    `uniforms`: the jitter's (R, n_samples) random numbers, drawn by the caller (`stratified_t`)."""
    radius = ray_radius(pixel_radius, origins.shape[0], origins.device)
    t_near, t_far = ray_box(origins, directions, field.octree.box_min, field.octree.box_max)
    t, deltas = stratified_t(t_near, t_far, n_samples, jitter, generator, uniforms)
    node, local = assign_nodes(field, origins, directions, t, deltas, radius, occupancy)
    offsets = ray_offsets(node >= 0)
    return AssignedRays(node, local, deltas.reshape(-1), offsets, PendingCount(offsets[-1]))


def split_assigned(rays: AssignedRays, n_batches: int) -> list[AssignedRays]:
    """`rays` assigned together, as `n_batches` batches of equally many consecutive rays, each as `assign_rays`
    would have assigned it alone: views of the samples, offsets from the batch's first ray, and each batch's count
    on its way to the host. Assigning several steps' batches at once issues the work of one."""
    n_rays, n_samples = rays.node.shape
    if n_batches < 1 or n_rays % n_batches:
        raise InputError(f"n_batches={n_batches} must divide the {n_rays} rays into equal batches")
    per = n_rays // n_batches
    if n_batches == 1:
        return [rays]
    firsts = rays.ray_offsets[0:n_rays:per]                                   # (n_batches,)
    counts = rays.ray_offsets[per::per] - firsts
    batches = []
    for b in range(n_batches):
        rows, samples = slice(b * per, (b + 1) * per), slice(b * per * n_samples, (b + 1) * per * n_samples)
        offsets = rays.ray_offsets[b * per:(b + 1) * per + 1] - firsts[b:b + 1]
        batches.append(AssignedRays(rays.node[rows], rays.local[samples], rays.deltas[samples], offsets,
                                    PendingCount(counts[b])))
    return batches


def shade_assigned(field, rays: AssignedRays, background: torch.Tensor | None = None) -> RayBatchResult:
    """`rays` (from `assign_rays`) through the field: the assigned samples gathered (this waits until the device
    has counted them), evaluated by their nodes and composited front to back over `background`; gradients flow
    to the node networks."""
    index = positions(rays.node >= 0, rays.n_assigned.value())
    node_ids = rays.node.reshape(-1)[index]
    with checks.disabled():  # ids come from the octree: in range by construction
        sigma, rgb = field.query_in_nodes(rays.local[index], node_ids)
    out = composite(sigma, rgb, rays.deltas[index].contiguous(), rays.ray_offsets, background)
    return RayBatchResult(out.rgb, out.opacity, node_ids, rays.ray_offsets)


def ray_radius(pixel_radius, n_rays: int, dev) -> torch.Tensor:
    """Each ray's pixel footprint radius per unit distance, (R,), from a number or an (R,) tensor."""
    if isinstance(pixel_radius, torch.Tensor):
        if pixel_radius.shape != (n_rays,):
            raise InputError(f"pixel_radius must be a float or have shape ({n_rays},), got "
                             f"{tuple(pixel_radius.shape)}")
        return pixel_radius.float().contiguous()
    if not (isinstance(pixel_radius, (int, float)) and pixel_radius > 0):
        raise InputError(f"pixel_radius={pixel_radius!r} must be a number > 0")
    return torch.full((n_rays,), float(pixel_radius), device=dev)


def render_rays(field, origins: torch.Tensor, directions: torch.Tensor, pixel_radius, n_samples: int,
                jitter: bool = False, background: torch.Tensor | None = None,
                generator: torch.Generator | None = None,
                occupancy: LevelOccupancy | OccupancyGrid | None = None) -> RayBatchResult:
    """Composite rays through the field; gradients flow to the node networks.

    pixel_radius: a float, or an (R,) tensor (rays from several pyramid levels in one batch). With an
    `occupancy` grid, samples in its empty voxels are not evaluated.
    """
    return shade_assigned(field, assign_rays(field, origins, directions, pixel_radius, n_samples, jitter, generator,
                                             occupancy), background)


# The most rays per pixel side `render_image` casts for a view beyond the root's scale.
MAX_SUPERSAMPLE = 4


def supersample_for(field, c2w: torch.Tensor, focal: float) -> int:
    """Rays per pixel side a view needs so that no sample's footprint is wider than the root's scale: 1 where the
    box's nearest point has a footprint of at most `field.lod_root_size` (the root, level 0, is trained from
    footprints up to that, by the coarsest pyramid level), else the power of two that brings it there (at most
    MAX_SUPERSAMPLE). A node drawn with wider footprints than it was fit to aliases (thin parts and edges come
    and go between pixels), where the truth at that distance is their average."""
    tree = field.octree
    origin = c2w[:3, 3].to(tree.box_min)
    outside = torch.maximum(tree.box_min - origin, origin - tree.box_max).clamp(min=0.0)
    radius = float(outside.norm()) * pixel_radius(focal)
    ratio = radius / field.lod_root_size
    k = 1
    while ratio > k and k < MAX_SUPERSAMPLE:
        k *= 2
    return k


@torch.no_grad()
def render_image(field, c2w: torch.Tensor, width: int, height: int, focal: float, n_samples: int,
                 background: torch.Tensor | None = None, chunk: int = 1 << 20, occupancy="auto",
                 early_stop: float = 1e-4, segments: int = 2, supersample="auto",
                 footprint_focal: float | None = None) -> dict:
    """Render one view of the octree field. Returns image (H, W, 3), first_node (H, W) (the node met first along
    each pixel's ray, -1 for none), touched (sorted distinct node ids evaluated for the frame), n_evaluated
    (samples the networks evaluated) and supersample (rays per pixel side).

    supersample: k x k rays per pixel, averaged (a box filter: the pixel's area), each with the pixel's footprint
    (the level of detail follows the pixel's distance, not the ray's share of it); "auto" takes `supersample_for`
    the view, which is 1 unless the whole box is farther than the root's scale reaches.
    footprint_focal: the focal length whose pixels' footprints pick the samples' levels (default: `focal`).

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
        occupancy = field.occupancy
    if isinstance(supersample, str) and supersample == "auto":
        supersample = supersample_for(field, c2w, focal)
    if isinstance(supersample, bool) or not isinstance(supersample, int) or not 1 <= supersample <= 16:
        raise InputError(f"supersample={supersample!r}; allowed: 'auto' or an integer in 1..16")
    if footprint_focal is not None and (isinstance(footprint_focal, bool) or
                                        not (isinstance(footprint_focal, (int, float)) and footprint_focal > 0)):
        raise InputError(f"footprint_focal={footprint_focal!r} must be a number > 0 (or None: focal)")
    if supersample > 1:
        k = supersample
        fine = render_image(field, c2w, width * k, height * k, focal * k, n_samples, background, chunk, occupancy,
                            early_stop, segments, supersample=1, footprint_focal=footprint_focal or focal)
        # The centre ray of each pixel names its first node (the pixel's own ray when k = 1).
        return {"image": fine["image"].view(height, k, width, k, 3).mean(dim=(1, 3)),
                "first_node": fine["first_node"][k // 2::k, k // 2::k].contiguous(), "touched": fine["touched"],
                "n_evaluated": fine["n_evaluated"], "supersample": k}
    runs = frame_runs(n_samples, segments, early_stop, chunk)
    origins, directions = camera_rays(c2w, width, height, focal)
    dev, n_rays = origins.device, origins.shape[0]
    bg = torch.zeros(3, device=dev) if background is None else torch.as_tensor(background).to(dev).float()
    if bg.shape != (3,):
        raise InputError(f"background must have shape (3,), got {tuple(bg.shape)}")
    radius = ray_radius(pixel_radius(footprint_focal or focal), n_rays, dev)
    t_near, t_far = ray_box(origins, directions, field.octree.box_min, field.octree.box_max)
    # A mark per node evaluated: plain stores of one value, where a per-node count (bincount) made every sample
    # an atomic add on one of a few counters, which serialise.
    touched = torch.zeros(field.n_nodes, dtype=torch.bool, device=dev)
    n_evaluated = 0
    color = torch.zeros(n_rays, 3, device=dev)
    trans = torch.ones(n_rays, device=dev)
    first = torch.full((n_rays,), -1, dtype=torch.int32, device=dev)
    # Finished rays stay in the list and march no samples (no compaction, no sync for it).
    with checks.disabled():  # node ids, points and offsets come from the octree and the marcher
        for start in range(0, n_rays, chunk):
            end = min(start + chunk, n_rays)
            rays = torch.arange(start, end, dtype=torch.int32, device=dev)
            for a, b in runs:
                node_ids, local, deltas, offsets = _march(field, origins, directions, t_near, t_far, radius, rays,
                                                          a, b, n_samples, occupancy, trans, early_stop)
                touched[node_ids] = True
                n_evaluated += node_ids.numel()
                if node_ids.numel():
                    sigma, rgb = field.query_in_nodes(local, node_ids)
                else:
                    sigma, rgb = torch.zeros(0, device=dev), torch.zeros(0, 3, device=dev)
                out = composite(sigma, rgb, deltas, offsets)  # black: the background goes behind every run
                color[start:end] += trans[start:end, None] * out.rgb
                trans[start:end] *= 1.0 - out.opacity
                seen = first[start:end]
                first[start:end] = torch.where(seen >= 0, seen, first_node_per_ray(node_ids, offsets))
    image = color + trans[:, None] * bg
    return {"image": image.view(height, width, 3), "first_node": first.view(height, width),
            "touched": torch.nonzero(touched).squeeze(1).to(torch.int32), "n_evaluated": n_evaluated,
            "supersample": 1}


def _march(field, origins, directions, t_near, t_far, radius, rays, first_bin, end_bin, n_samples, occupancy,
           trans, early_stop):
    """Packed samples of bins first_bin..end_bin-1 of the listed rays that have a node (none for rays whose
    transmittance `trans` is at most early_stop > 0): node ids, local coordinates, bin lengths and ray
    offsets (len(rays) + 1, int32)."""
    from ..kernels import octree as octree_kernels

    dev = origins.device
    k = field.octree.kernel_tables
    occupancy = skipping_grid(field, occupancy)
    occupied, occ_res, grids = occupancy_arguments(field, occupancy)
    geo = k.geometry(occupancy)
    cutoff = float(early_stop) if early_stop > 0 else -1.0
    head = (origins.contiguous(), directions.contiguous(), t_near.contiguous(), t_far.contiguous(),
            radius.contiguous(), trans.contiguous(), cutoff, rays.contiguous(), int(first_bin), int(end_bin),
            int(n_samples), k.children, k.split, k.depth)
    tail = (field.lod_root_size, field.octree.max_depth, field.octree.deepest, occupied, occ_res, grids)
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


def first_node_per_ray(node_ids: torch.Tensor, ray_offsets: torch.Tensor) -> torch.Tensor:
    """The node of each ray's first evaluated sample, -1 for rays with none."""
    starts, ends = ray_offsets[:-1].long(), ray_offsets[1:].long()
    has = ends > starts
    out = torch.full(starts.shape, -1, dtype=torch.int32, device=node_ids.device)
    out[has] = node_ids[starts[has]]
    return out

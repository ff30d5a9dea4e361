"""Octree LoD scene: construction, level selection, lookup against a brute-force reference, and an end-to-end
training run of the demo on a tiny procedural scene (CPU)."""
import math
import re

import pytest
import torch

import tinn
from tinn.errors import ConfigError, InputError
from tinn.scenes.acceleration.octree import Octree, levels_for_radius

BOX = ([-1.0, -1.0, -1.0], [1.0, 1.0, 1.0])
DEV = tinn.runtime.device()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small tensors: torch's thread pool only adds barrier waits, which explode when the cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# Two clusters in opposite corners: 5 points near (-1,-1,-1), 3 near (1,1,1).
CORNER_A = [(-0.95, -0.95, -0.95), (-0.80, -0.95, -0.95), (-0.95, -0.80, -0.95), (-0.96, -0.96, -0.96),
            (-0.94, -0.94, -0.94)]
CORNER_B = [(0.9, 0.9, 0.9), (0.8, 0.85, 0.95), (0.95, 0.95, 0.8)]


def corners_tree():
    return Octree.build(torch.tensor(CORNER_A + CORNER_B, device=DEV), *BOX, max_depth=4, min_points=3)


def test_build_two_corners_exact_layout():
    tree = corners_tree()
    # root (8 points) splits into the two occupied corner octants; the 3-point corner stays a leaf (3 is not > 3);
    # the 5-point one splits down to depth 4, where its points fall into 3 octants of the depth-3 cell.
    assert tree.nodes_per_level() == [1, 2, 1, 1, 3]
    assert tree.n_nodes == 8 and tree.deepest == 4
    assert tree.children[0].tolist() == [1, -1, -1, -1, -1, -1, -1, 2]   # 6 empty octants pruned
    assert tree.children[1].tolist() == [3, -1, -1, -1, -1, -1, -1, -1]
    assert tree.children[2].tolist() == [-1] * 8                          # leaf
    assert tree.children[4].tolist() == [5, 6, 7, -1, -1, -1, -1, -1]
    assert tree.parent.tolist() == [-1, 0, 0, 1, 3, 4, 4, 4]
    assert tree.depth.tolist() == [0, 1, 1, 2, 3, 4, 4, 4]
    assert tree.point_count.tolist() == [8, 5, 3, 5, 5, 3, 1, 1]
    assert tree.half_size.tolist() == [1.0, 0.5, 0.5, 0.25, 0.125, 0.0625, 0.0625, 0.0625]
    assert torch.allclose(tree.center[2], torch.tensor([0.5, 0.5, 0.5], device=DEV))
    assert torch.allclose(tree.center[6], torch.tensor([-0.8125, -0.9375, -0.9375], device=DEV))
    assert tree.is_leaf().tolist() == [False, False, True, False, False, True, True, True]
    # Each node's point range holds exactly its points.
    pts = tree.points
    for node in range(tree.n_nodes):
        f, c = int(tree.point_first[node]), int(tree.point_count[node])
        inside = ((pts - tree.center[node]).abs() <= tree.half_size[node]).all(dim=1)
        assert int(inside.sum()) == c and bool(inside[f:f + c].all())


def test_lookup_known_points():
    tree = corners_tree()
    cases = [  # point, level, expected node
        ((-0.95, -0.95, -0.95), 10, 5),   # deeper than any node: clamped to the leaf
        ((-0.95, -0.95, -0.95), 2, 3),
        ((-0.95, -0.95, -0.95), 0, 0),
        ((-0.95, -0.95, -0.95), -3, 0),   # negative levels select the root
        ((0.9, 0.9, 0.9), 4, 2),           # the corner-B leaf at depth 1
        ((0.5, -0.5, 0.5), 0, 0),          # empty octant, but level 0 asks for the root
        ((0.5, -0.5, 0.5), 1, -1),         # pruned octant
        ((-0.6, -0.6, -0.6), 1, 1),
        ((-0.6, -0.6, -0.6), 2, 3),
        ((-0.6, -0.6, -0.6), 3, -1),       # node 3's octant towards the centre was pruned
        ((-0.9, -0.8, -0.95), 4, 7),
        ((1.5, 0.0, 0.0), 0, -1),          # outside the box
        ((1.0, 1.0, 1.0), 1, 2),           # on the box face: inside
    ]
    points = torch.tensor([c[0] for c in cases], device=DEV)
    levels = torch.tensor([c[1] for c in cases], dtype=torch.int32, device=DEV)
    assert tree.lookup(points, levels).tolist() == [c[2] for c in cases]
    assert tree.lookup(points[:1], 2).tolist() == [3]  # an int level for all points


def test_non_cubic_box_ignores_points_outside():
    box_min, box_max = [-1.0, -0.5, -0.25], [1.0, 0.5, 0.25]
    # the second point lies in the root cube, outside the box
    pts = torch.tensor([[0.5, 0.2, 0.1], [0.0, 0.9, 0.0]], device=DEV)
    tree = Octree.build(pts, box_min, box_max, max_depth=2, min_points=0)
    assert tree.edge == 2.0 and tree.point_count[0].item() == 1
    assert tree.nodes_per_level() == [1, 1, 1]
    assert tree.lookup(pts, 2).tolist() == [2, -1]


def test_levels_for_radius_formula():
    r = torch.tensor([2.0, 1.0, 0.99, 0.5, 0.26, 4.0, 0.25, 1e-3], device=DEV)
    assert levels_for_radius(r, 2.0).tolist() == [0, 1, 1, 2, 2, 0, 3, 10]
    assert levels_for_radius(torch.tensor([0.0], device=DEV), 2.0).item() > 20  # radius 0: the finest level there is
    gen = torch.Generator().manual_seed(0)
    r = (torch.rand(1000, generator=gen) * 0.5 + 1e-4).to(DEV)
    expected = [max(0, math.floor(math.log2(3.0 / v))) for v in r.double().tolist()]
    assert levels_for_radius(r, 3.0).tolist() == expected
    # Exact powers of two and their float32 neighbours: a logarithm rounding either way would move the level.
    k = torch.arange(0, 40)
    r = torch.ldexp(torch.ones(40), -k)
    above = torch.nextafter(r, torch.full_like(r, 1.0e9))
    assert levels_for_radius(r.to(DEV), 1.0).tolist() == k.tolist()
    assert levels_for_radius(above.to(DEV), 1.0).tolist() == [0] + (k[1:] - 1).tolist()
    assert levels_for_radius(r.to(DEV) * 3, 3.0).tolist() == k.tolist()


def _brute_force_lookup(tree: Octree, point, level) -> int:
    """Walks down a host copy of the tree (`tree.to("cpu")`): thousands of tiny ops, each a launch on a GPU."""
    assert tree.device.type == "cpu"
    p = torch.tensor(point)
    if not bool(((p >= tree.box_min) & (p <= tree.box_max)).all()):
        return -1
    node = 0
    for d in range(level):
        kids = [k for k in tree.children[node].tolist() if k >= 0]
        if not kids:
            return node
        # Cells are half-open [lo, hi) (a point on a shared face belongs to the upper cell), closed at the root's top.
        top = tree.root_min + tree.edge
        inside = [k for k in kids
                  if bool(((p >= tree.center[k] - tree.half_size[k])
                           & ((p < tree.center[k] + tree.half_size[k]) | (tree.center[k] + tree.half_size[k] >= top)))
                          .all())]
        if not inside:
            return -1
        node = inside[0]
    return node


def test_lookup_matches_brute_force_reference():
    gen = torch.Generator().manual_seed(3)
    blobs = torch.tensor([[0.3, -0.4, 0.2], [-0.6, 0.5, -0.1], [0.1, 0.7, 0.6]])
    pts = (blobs[torch.randint(0, 3, (400,), generator=gen)] + 0.15 * torch.randn(400, 3, generator=gen))
    tree = Octree.build(pts.to(DEV), *BOX, max_depth=5, min_points=4)
    assert tree.deepest == 5 and tree.n_nodes > 40
    queries = torch.rand(1500, 3, generator=gen) * 2.4 - 1.2
    levels = torch.randint(-1, 8, (1500,), generator=gen, dtype=torch.int32)
    got = tree.lookup(queries.to(DEV), levels.to(DEV)).tolist()
    host = tree.to("cpu")
    want = [_brute_force_lookup(host, q, int(lv)) for q, lv in zip(queries.tolist(), levels.tolist())]
    assert got == want
    assert sum(w == -1 for w in want) > 100 and len(set(want)) > 30  # both empty space and many nodes seen


@pytest.mark.parametrize("kwargs, match", [
    ({"points": torch.zeros(4, 2, device=DEV)}, "points"),
    ({"points": torch.zeros(4, 3, dtype=torch.int64, device=DEV)}, "points"),
    ({"points": torch.tensor([[0.0, float("nan"), 0.0]], device=DEV)}, "NaN"),
    ({"points": torch.full((3, 3), 5.0, device=DEV)}, "no point"),
    ({"box_max": [1.0, -1.0, 1.0]}, "box_max"),
    ({"box_min": [0.0, 0.0]}, "box_min"),
    ({"max_depth": -1}, "max_depth"),
    ({"max_depth": 17}, "max_depth"),
    ({"max_depth": 2.0}, "max_depth"),
    ({"min_points": -1}, "min_points"),
])
def test_build_bad_input(kwargs, match):
    args = {"points": torch.zeros(4, 3, device=DEV), "box_min": BOX[0], "box_max": BOX[1], "max_depth": 3,
            "min_points": 1}
    args.update(kwargs)
    with pytest.raises(InputError, match=match):
        Octree.build(**args)


def test_lookup_and_levels_bad_input():
    tree = corners_tree()
    with pytest.raises(InputError, match="levels"):
        tree.lookup(torch.zeros(3, 3, device=DEV), torch.zeros(2, dtype=torch.int32, device=DEV))
    with pytest.raises(InputError, match="levels"):
        tree.lookup(torch.zeros(3, 3, device=DEV), torch.zeros(3, device=DEV))
    with pytest.raises(InputError, match="points"):
        tree.lookup(torch.zeros(3, 4, device=DEV), 1)
    with pytest.raises(InputError, match="sample_radius"):
        levels_for_radius(torch.tensor([0.1, -0.1], device=DEV), 2.0)
    with pytest.raises(InputError, match="root_size"):
        levels_for_radius(torch.tensor([0.1], device=DEV), 0.0)


# ---- the field: one network per node, rendered through tinn.render -------------------------------------------
TINY_ENCODING = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
                 "base_resolution": 2, "per_level_scale": 2.0}
TINY_NETWORK = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1}


def blob_field(seed=0):
    from tinn.scenes.fields.octree_field import OctreeField

    gen = torch.Generator().manual_seed(seed)
    pts = torch.tensor([0.3, -0.2, 0.1]) + 0.25 * torch.randn(300, 3, generator=gen)
    tree = Octree.build(pts.to(DEV), *BOX, max_depth=3, min_points=4)
    return OctreeField(tree, TINY_ENCODING, TINY_NETWORK, seed=seed + 5)


def aimed_rays(n, seed=0, spread=0.6):
    gen = torch.Generator().manual_seed(seed)
    origins = torch.randn(n, 3, generator=gen)
    origins = 3.0 * origins / origins.norm(dim=1, keepdim=True)
    targets = (torch.rand(n, 3, generator=gen) - 0.5) * 2 * spread
    directions = targets - origins
    return origins.to(DEV), (directions / directions.norm(dim=1, keepdim=True)).to(DEV)


def test_render_rays_matches_float64_reference():
    from tinn.render import ray_box, stratified_t

    field = blob_field()
    assert field.lod_root_size == 2.0 / 4  # edge / finest grid resolution (2 * 2^1)
    origins, directions = aimed_rays(24)
    background = torch.tensor([0.2, 0.5, 1.0], device=DEV)
    radius = 0.004
    res = field.render_rays(origins, directions, radius, n_samples=20, background=background)

    t_near, t_far = ray_box(origins, directions, *BOX)
    t, deltas = stratified_t(t_near, t_far, 20, jitter=False)
    # The reference walks ray by ray on the host; only the per-sample network queries go to the device.
    t, deltas, o_host, d_host, tree = t.cpu(), deltas.cpu(), origins.cpu(), directions.cpu(), field.octree.to("cpu")
    expected_rgb, expected_opacity, n_evaluated = [], [], 0
    for r in range(24):
        log_t, color = 0.0, torch.zeros(3, dtype=torch.float64)
        for s in range(20):
            if float(deltas[r, s]) <= 0:
                continue
            p = o_host[r] + float(t[r, s]) * d_host[r]
            level = max(0, math.floor(math.log2(field.lod_root_size / (float(t[r, s]) * radius))))
            node = _brute_force_lookup(tree, p.tolist(), level)
            if node < 0:
                continue
            with torch.no_grad():
                sigma, rgb = field.query(p[None].to(DEV), torch.tensor([node], dtype=torch.int32, device=DEV))
            alpha = 1 - math.exp(-float(sigma) * float(deltas[r, s]))
            color += math.exp(log_t) * alpha * rgb[0].double().cpu()
            log_t += -float(sigma) * float(deltas[r, s])
            n_evaluated += 1
        expected_rgb.append(color + math.exp(log_t) * background.double().cpu())
        expected_opacity.append(1 - math.exp(log_t))
    assert res.node_ids.shape[0] == n_evaluated > 100
    assert torch.allclose(res.rgb.double().cpu(), torch.stack(expected_rgb), atol=2e-5)
    assert torch.allclose(res.opacity.double().cpu(), torch.tensor(expected_opacity, dtype=torch.float64), atol=2e-5)


def test_gradients_reach_only_the_nodes_along_the_rays():
    field = blob_field(1)
    origins, directions = aimed_rays(16, seed=4, spread=0.1)
    res = field.render_rays(origins, directions, 0.004, n_samples=24, background=torch.ones(3, device=DEV))
    ((res.rgb - 0.5) ** 2).sum().backward()
    touched = set(torch.unique(res.node_ids).tolist())
    for name, p in field.model.named_parameters():
        rows = set(torch.nonzero(p.grad.abs().sum(dim=1) > 0).squeeze(1).tolist())
        assert rows and rows <= touched, name
    assert 0 < len(touched) < field.n_nodes
    report = field.touched_report(torch.tensor(sorted(touched), device=DEV))
    assert report["params_touched"] == len(touched) * field.params_per_node()
    assert report["params_total"] == field.n_nodes * field.params_per_node()
    assert report["fraction_touched"] == pytest.approx(len(touched) / field.n_nodes)


def test_field_bad_input():
    from tinn.errors import ConfigError
    from tinn.scenes.fields.octree_field import OctreeField

    field = blob_field()
    o, d = aimed_rays(4)
    with pytest.raises(InputError, match="pixel_radius"):
        field.render_rays(o, d, torch.ones(3, device=DEV), n_samples=4)
    with pytest.raises(InputError, match="pixel_radius"):
        field.render_rays(o, d, -1.0, n_samples=4)
    with pytest.raises(InputError, match="octree"):
        OctreeField("not a tree")
    with pytest.raises(ConfigError, match="lod_resolution"):
        OctreeField(field.octree, TINY_ENCODING, TINY_NETWORK, lod_resolution=0)


# ---- the single-launch renderer against the former per-level path ---------------------------------------------
def _per_level_lookup(tree: Octree, points, levels):
    """The former `Octree.lookup`: one vectorised torch step per depth (the reference for the kernel's walk)."""
    from tinn.scenes.acceleration.octree import cell_coords, inside_box

    node = torch.where(inside_box(points, tree.box_min, tree.box_max), 0, -1).to(torch.int64)
    q = cell_coords(points, tree.root_min, tree.edge, tree.max_depth)
    children = tree.children.long()
    for d in range(tree.deepest):
        bit = tree.max_depth - 1 - d
        slot = ((q[:, 0] >> bit) & 1) | (((q[:, 1] >> bit) & 1) << 1) | (((q[:, 2] >> bit) & 1) << 2)
        safe = node.clamp(min=0)
        descend = (node >= 0) & (levels > d) & tree.split[safe]
        node = torch.where(descend, children[safe, slot], node)
    return node.to(torch.int32)


def _reference_image(field, c2w, size, focal, n_samples, background, occupancy=None):
    """The former render path (torch points and levels, per-level lookup, the field's query), composited in
    float64; with `occupancy`, samples in its empty voxels (grid of the node's depth) count as empty."""
    from tinn.render import camera_rays, pixel_radius, ray_box, stratified_t

    origins, directions = camera_rays(c2w, size, size, focal)
    t_near, t_far = ray_box(origins, directions, field.octree.box_min, field.octree.box_max)
    t, deltas = stratified_t(t_near, t_far, n_samples, False)
    points = (origins[:, None, :] + t[..., None] * directions[:, None, :]).reshape(-1, 3)
    ids = _per_level_lookup(field.octree, points, levels_for_radius((t * pixel_radius(focal)).reshape(-1),
                                                                    field.lod_root_size))
    keep = (ids >= 0) & (deltas.reshape(-1) > 0)
    if occupancy is not None:
        keep &= occupancy.query(points, field.octree.depth[ids.clamp(min=0).long()])
    sigma = torch.zeros(points.shape[0], dtype=torch.float64, device=points.device)
    rgb = torch.zeros(points.shape[0], 3, dtype=torch.float64, device=points.device)
    with torch.no_grad():
        s, c = field.query(points[keep], ids[keep])
    sigma[keep], rgb[keep] = s.double(), c.double()
    x = (sigma * deltas.reshape(-1).double()).view(-1, n_samples)
    trans = torch.exp(-torch.cumsum(x, dim=1))
    before = torch.cat([torch.ones_like(trans[:, :1]), trans[:, :-1]], dim=1)
    color = ((before * (1 - torch.exp(-x)))[..., None] * rgb.view(-1, n_samples, 3)).sum(dim=1)
    color = color + trans[:, -1:] * background.double()
    return color.view(size, size, 3), int(keep.sum()), ids.view(-1, n_samples), keep.view(-1, n_samples)


def _look_at_origin(distance, axis=2):
    c2w = torch.eye(4)
    c2w[axis, 3] = distance
    if axis != 2:  # a camera on another axis: rotate so that -z points at the origin
        c2w[:3, :3] = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    return c2w.to(DEV)


def test_lookup_kernel_matches_the_per_level_reference_and_sends_nan_to_empty():
    gen = torch.Generator().manual_seed(5)
    pts = (torch.randn(500, 3, generator=gen) * 0.3).to(DEV)
    tree = Octree.build(pts, *BOX, max_depth=6, min_points=2)
    queries = (torch.rand(4000, 3, generator=gen) * 2.2 - 1.1).to(DEV)
    levels = torch.randint(-2, 9, (4000,), generator=gen, dtype=torch.int32).to(DEV)
    assert torch.equal(tree.lookup(queries, levels), _per_level_lookup(tree, queries, levels))
    nan = torch.tensor([[float("nan"), 0.0, 0.0], [0.0, 0.0, float("inf")]], device=DEV)
    assert tree.lookup(nan, 3).tolist() == [-1, -1]


@pytest.mark.parametrize("mode", ["one_run", "segments_no_stop"])
def test_render_image_equals_the_per_level_path(mode):
    field = blob_field(2)
    background = torch.tensor([0.3, 0.6, 0.9], device=DEV)
    c2w = _look_at_origin(2.6)
    kwargs = {"one_run": dict(segments=1), "segments_no_stop": dict(segments=4, early_stop=0.0)}[mode]
    frame = field.render_image(c2w, 20, 20, 18.0, 24, background=background, occupancy=None, chunk=150, supersample=1,
                               **kwargs)
    want, n_kept, ids, keep = _reference_image(field, c2w, 20, 18.0, 24, background)
    assert frame["n_evaluated"] == n_kept > 1000
    assert torch.allclose(frame["image"].double(), want, atol=2e-6)
    assert frame["touched"].tolist() == sorted(set(ids[keep].tolist()))
    first = torch.where(keep.any(dim=1), ids.gather(1, keep.int().argmax(dim=1, keepdim=True)).squeeze(1), -1)
    assert frame["first_node"].reshape(-1).tolist() == first.tolist()


def test_render_image_skips_empty_voxels_of_the_node_depth_grid():
    from tinn.scenes.acceleration.octree_occupancy import LevelOccupancy

    field = blob_field(3)
    gen = torch.Generator().manual_seed(1)
    occupied = (torch.rand(field.octree.deepest + 1, 8, 8, 8, generator=gen) < 0.5).to(DEV)
    occupancy = LevelOccupancy(occupied, *BOX)
    background = torch.tensor([1.0, 1.0, 1.0], device=DEV)
    c2w = _look_at_origin(2.4, axis=0)
    frame = field.render_image(c2w, 16, 16, 14.0, 20, background=background, occupancy=occupancy, segments=1,
                               supersample=1)
    want, n_kept, _, _ = _reference_image(field, c2w, 16, 14.0, 20, background, occupancy)
    everything = _reference_image(field, c2w, 16, 14.0, 20, background)[1]
    assert 200 < n_kept < 0.7 * everything
    if DEV.type == "cpu":
        assert frame["n_evaluated"] == n_kept
        assert torch.allclose(frame["image"].double(), want, atol=2e-6)
    else:  # on CUDA the kernel's float32 points differ from torch's in the last bit (contracted multiply-adds),
        # which moves a few samples across a voxel face: 6 of about 1,240 on the H100
        assert abs(frame["n_evaluated"] - n_kept) <= 0.01 * n_kept
        assert float((frame["image"].double() - want).abs().mean()) < 2e-3


def test_early_termination_changes_a_pixel_by_at_most_early_stop(monkeypatch):
    import tinn.scenes.fields.octree_field as of

    monkeypatch.setattr(of, "DENSITY_BIAS", 4.0)  # an opaque field: rays saturate early
    field = blob_field(4)
    background = torch.tensor([0.0, 1.0, 0.0], device=DEV)
    c2w = _look_at_origin(2.5)
    want, n_kept, _, _ = _reference_image(field, c2w, 16, 16.0, 32, background)
    for early_stop in (1e-4, 1e-2):
        frame = field.render_image(c2w, 16, 16, 16.0, 32, background=background, occupancy=None, segments=4,
                                   early_stop=early_stop, supersample=1)
        assert frame["n_evaluated"] < 0.85 * n_kept                  # the rays' back samples were skipped
        assert float((frame["image"].double() - want).abs().max()) <= early_stop + 1e-6


def test_level_occupancy_marks_the_voxels_where_a_depth_has_density():
    from tinn.scenes.acceleration.octree_occupancy import LevelOccupancy

    field = blob_field(5)
    res, threshold = 6, 0.25
    grid = LevelOccupancy.from_field(field, res, threshold, n_jitter=1, dilate=0)
    axis = (torch.arange(res, dtype=torch.float32, device=DEV) + 0.5) / res * 2 - 1
    centres = torch.stack(torch.meshgrid(axis, axis, axis, indexing="ij"), dim=-1).reshape(-1, 3)
    for depth in range(field.octree.deepest + 1):
        ids = _per_level_lookup(field.octree, centres, torch.full((centres.shape[0],), depth, dtype=torch.int32,
                                                                  device=DEV))
        sigma = torch.zeros(centres.shape[0], device=DEV)
        with torch.no_grad():
            sigma[ids >= 0] = field.query(centres[ids >= 0], ids[ids >= 0])[0]
        assert grid.occupied[depth].reshape(-1).tolist() == (sigma > threshold).tolist()
    assert 0 < grid.occupied.float().mean() < 1
    dilated = LevelOccupancy.from_field(field, res, threshold, n_jitter=1, dilate=1)
    grown = torch.nn.functional.max_pool3d(grid.occupied[:, None].float(), 3, stride=1, padding=1)[:, 0] > 0
    assert torch.equal(dilated.occupied, grown)


def test_far_camera_selects_only_the_levels_of_the_formula_and_touches_few_parameters():
    field = blob_field(6)
    focal, size, n_samples = 20.0, 16, 48
    reach = math.sqrt(3.0)  # the box [-1, 1]^3 lies within this distance of the origin
    reports = {}
    for distance in (8.0, 3.0):
        # Samples lie at t >= distance - reach, so their footprint is at least (distance - reach) * 0.5 / focal.
        finest = math.floor(math.log2(field.lod_root_size / ((distance - reach) * 0.5 / focal)))
        frame = field.render_image(_look_at_origin(distance), size, size, focal, n_samples, occupancy=None)
        rep = field.touched_report(frame["touched"])
        depths = [d for d, n in enumerate(rep["nodes_touched_per_depth"]) if n]
        assert max(depths) == min(finest, field.octree.deepest), (distance, depths)
        reports[distance] = (finest, rep)
    (far_level, far), (near_level, near) = reports[8.0], reports[3.0]
    assert far_level == 1 and near_level == 3
    assert far["fraction_touched"] <= 0.15 and near["fraction_touched"] > 2 * far["fraction_touched"]
    assert far["param_bytes_touched"] == far["nodes_touched"] * field.memory_bytes() // field.n_nodes
    assert far["param_bytes_touched"] <= 0.15 * far["param_bytes_total"]


def test_views_beyond_the_roots_scale_are_supersampled_with_the_pixels_footprint():
    from tinn.render.octree import MAX_SUPERSAMPLE, supersample_for

    field = blob_field(2)
    focal, size = 18.0, 12
    background = torch.tensor([0.3, 0.6, 0.9], device=DEV)
    # The box [-1, 1]^3: its nearest point is at distance - 1 along the axis; k doubles until that footprint,
    # divided by k, is within the root's scale.
    for distance in (2.6, 6.0, 30.0, 300.0):
        radius = (distance - 1.0) * 0.5 / focal
        want = 1
        while radius / want > field.lod_root_size and want < MAX_SUPERSAMPLE:
            want *= 2
        assert supersample_for(field, _look_at_origin(distance), focal) == want, distance
    assert supersample_for(field, _look_at_origin(2.6), focal) == 1
    assert supersample_for(field, _look_at_origin(300.0), focal) == MAX_SUPERSAMPLE
    c2w = _look_at_origin(2.6)
    # A pixel's k x k rays are the rays of a k times finer frame whose samples take the coarse pixel's footprint.
    fine = field.render_image(c2w, 2 * size, 2 * size, 2 * focal, 24, background=background, occupancy=None,
                              supersample=1, footprint_focal=focal)
    frame = field.render_image(c2w, size, size, focal, 24, background=background, occupancy=None, supersample=2)
    assert frame["supersample"] == 2 and frame["image"].shape == (size, size, 3)
    assert torch.allclose(frame["image"], fine["image"].view(size, 2, size, 2, 3).mean(dim=(1, 3)), atol=1e-6)
    assert torch.equal(frame["first_node"], fine["first_node"][1::2, 1::2])
    assert frame["touched"].tolist() == fine["touched"].tolist() and frame["n_evaluated"] == fine["n_evaluated"]
    # The same rays with their own (half) footprints reach deeper nodes: the level follows the pixel, not the ray.
    own = field.render_image(c2w, 2 * size, 2 * size, 2 * focal, 24, background=background, occupancy=None,
                             supersample=1)
    depth = field.octree.depth.long()
    deepest = field.octree.deepest
    assert int((depth[own["touched"].long()] == deepest).sum()) > int((depth[frame["touched"].long()] == deepest).sum())
    auto = field.render_image(c2w, size, size, focal, 24, background=background, occupancy=None)
    assert auto["supersample"] == 1
    for bad in (0, 17, 1.5, True, "max"):
        with pytest.raises(InputError, match="supersample"):
            field.render_image(c2w, 4, 4, 4.0, 8, supersample=bad)
    for bad in (0.0, -1.0, True, "f"):
        with pytest.raises(InputError, match="footprint_focal"):
            field.render_image(c2w, 4, 4, 4.0, 8, footprint_focal=bad)


def test_render_image_bad_input():
    from tinn.scenes.acceleration.occupancy import OccupancyGrid

    field = blob_field()
    c2w = _look_at_origin(3.0)
    with pytest.raises(InputError, match="segments"):
        field.render_image(c2w, 4, 4, 4.0, 8, segments=9)
    with pytest.raises(InputError, match="early_stop"):
        field.render_image(c2w, 4, 4, 4.0, 8, early_stop=1.0)
    with pytest.raises(InputError, match="occupancy"):
        field.render_image(c2w, 4, 4, 4.0, 8, occupancy="yes")
    with pytest.raises(InputError, match="octree's box"):
        field.render_image(c2w, 4, 4, 4.0, 8, occupancy=OccupancyGrid(torch.ones(2, 2, 2, dtype=torch.bool,
                                                                                device=DEV), [-2.0] * 3, [2.0] * 3))
    with pytest.raises(InputError, match="background"):
        field.render_image(c2w, 4, 4, 4.0, 8, background=torch.ones(4, device=DEV))


# ---- end to end: the demo trains a tiny procedural scene -------------------------------------------------------
@pytest.mark.slow
def test_demo_trains_tiny_scene_and_far_camera_touches_coarse_nodes(tmp_path):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    s = octree_lod.run(["--small", "--res", "24", "--views", "16", "--test-views", "2", "--steps", "250",
                        "--pyramid-levels", "2", "--samples", "32", "--batch", "512", "--out", str(tmp_path)])
    # Measured 27.6 dB held out, 24.8 dB at half resolution (background alone: 9.3 dB).
    assert s["psnr"] > 25.0 and s["psnr"] > s["background_psnr"] + 15
    assert s["psnr_x2"] > 23.5
    assert s["nodes_per_level"][0] == 1 and sum(s["nodes_per_level"]) == s["nodes"]
    assert s["hull_res"] == 32 and 0.0 < s["hull_fraction"] < 0.6        # the small preset skips outside its hull
    near, far = s["near"], s["far"]
    assert 0 < near["fraction_touched"] < 0.6 and near["params_touched"] < near["params_total"]
    assert sum(near["nodes_touched_per_depth"][2:]) > 0                # near: fine nodes
    assert far["nodes_touched"] < near["nodes_touched"]
    assert sum(far["nodes_touched_per_depth"][2:]) == 0                # far: only depths 0-1
    for name in ("test_prediction.png", "far_prediction.png", "near_first_node.png", "summary.json"):
        assert (tmp_path / name).exists()
    # The level-of-detail curve: farther cameras use coarser levels and fewer parameters, each judged against the
    # truth area-filtered at its distance.
    curve = s["lod_curve"]
    assert [r["factor"] for r in curve] == [1.0, 2.0, 4.0, 8.0]
    assert [r["level"] for r in curve] == sorted((r["level"] for r in curve), reverse=True)
    assert curve[0]["level"] > curve[-1]["level"]
    assert curve[-1]["fraction_touched"] < curve[0]["fraction_touched"]
    # Measured 27.4 and 25.7 dB (its two held-out views pooled; view 0 alone 27.0 and 26.3) at the two levels its
    # 2-level pyramid trains (levels 2 and 1); the root, which no pyramid level trains here, is 16.3 dB at 4x.
    assert all(r["psnr"] > 23.0 for r in curve[:2]), curve
    assert all(len(r["psnr_per_view"]) == 2 for r in curve)


def test_foreground_points_cover_the_surfaces_and_carve_empty_space():
    from tinn.scenes.training.octree_training import foreground_points
    from tinn.scenes.data.procedural import ProceduralScene, render_views, surface_points

    scene = ProceduralScene()
    views = render_views(scene, 24, 32, 32, seed=0, n_samples=64)
    hull = foreground_points(views, resolution=24)
    voxel = 2.0 / 24
    assert 0 < hull.shape[0] < 0.5 * 24 ** 3
    assert float(scene.sdf(hull).max()) < 0.45                     # nothing far from the objects survives
    surface = surface_points(scene, 500, seed=1)
    nearest = torch.cdist(surface, hull).amin(dim=1)
    assert float((nearest <= voxel * math.sqrt(3) / 2 + 1e-6).float().mean()) > 0.97   # surfaces are kept


def _write_nerf_synthetic(root, n_train, n_test, size):
    """A NeRF-synthetic style folder (RGB PNGs, transforms json) rendered from the procedural scene."""
    import json

    import imageio.v3 as iio
    import numpy as np

    from tinn.scenes.data.procedural import ProceduralScene, render_views

    scene = ProceduralScene()
    for split, n, seed in (("train", n_train, 0), ("test", n_test, 7)):
        views = render_views(scene, n, size, size, seed=seed, n_samples=64)
        (root / split).mkdir(parents=True)
        frames = []
        for v in range(n):
            iio.imwrite(root / split / f"r_{v}.png", (views.images[v].cpu().numpy() * 255 + 0.5).astype(np.uint8))
            frames.append({"file_path": f"./{split}/r_{v}", "transform_matrix": views.c2w[v].tolist()})
        angle = 2 * math.atan(0.5 * size / views.focal)
        (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": angle, "frames": frames}))


def test_demo_on_a_nerf_synthetic_folder_and_in_the_headless_viewer(tmp_path, monkeypatch, capsys):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    _write_nerf_synthetic(tmp_path / "scene", 12, 2, 32)
    s = octree_lod.run(["--data", str(tmp_path / "scene"), "--small", "--res", "16", "--steps", "40",
                        "--pyramid-levels", "2", "--samples", "32", "--batch", "256", "--out", str(tmp_path / "a")])
    assert s["views"] == 12 and s["resolution"] == [16, 16]
    assert s["nodes"] > 9 and s["psnr"] > s["background_psnr"] + 3   # built over the visual hull, learning
    monkeypatch.setenv("TINN_VIEWER_BACKEND", "png")
    seen, render_from = [], octree_lod.OctreeSource.render_from

    def spy(source, c2w):  # the orbit camera's renders, with the held-out view's
        if not seen:  # from the held-out pose, render_from is render()
            assert torch.equal(render_from(source, source.test.c2w[source.view]), source.render())
        seen.append((c2w.clone(), render_from(source, c2w), source.render()))
        return seen[-1][1]

    monkeypatch.setattr(octree_lod.OctreeSource, "render_from", spy)
    # The loss/network panel: each node's error on the held-out view (float64 reference, node by node) ...
    node_losses, per_network_loss = [], octree_lod.OctreeSource.per_network_loss

    def loss_spy(source):
        before = source._node_loss_at
        out = per_network_loss(source)
        if source._node_loss_at != before:  # freshly rendered by this call
            frame = source._frame()
            error = (frame["image"].double() - source.reference().double()).square().mean(-1).reshape(-1)
            first = frame["first_node"].reshape(-1)
            expected = torch.zeros(source.field.n_nodes, dtype=torch.float64, device=error.device)
            for node in range(source.field.n_nodes):
                if (first == node).any():
                    expected[node] = error[first == node].mean()
            node_losses.append((out.clone(), expected))
        return out

    monkeypatch.setattr(octree_lod.OctreeSource, "per_network_loss", loss_spy)
    # ... painted into the frames.
    from tinn.viewer import render as viewer_render
    painted, network_loss_image = [], viewer_render.network_loss_image
    monkeypatch.setattr(viewer_render, "network_loss_image",
                        lambda losses, ids: painted.append(losses) or network_loss_image(losses, ids))
    v = octree_lod.run(["--small", "--res", "16", "--views", "6", "--test-views", "1", "--steps", "3",
                        "--pyramid-levels", "2", "--samples", "16", "--batch", "128", "--gui", "--headless",
                        "--out", str(tmp_path / "gui")])
    assert v["steps"] == 3 and len(v["frames"]) == 4 and v["final_psnr"] is not None
    assert re.search(rf"3 steps, PSNR {v['final_psnr']:.2f} dB$", capsys.readouterr().out, re.M)
    assert node_losses and len(painted) == len(v["frames"])   # every frame paints the panel (the first: untrained)
    for got, expected in node_losses:
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-7)
        assert (got > 0).sum() > 1
    # Headless frames after the first orbit the scene at the held-out view's distance, 15 degrees apart.
    assert len(seen) == 3
    radius = seen[0][0][:3, 3].norm()
    for (a, image, heldout), (b, _, _) in zip(seen, seen[1:] + [seen[-1]]):
        assert (a[:3, 3].norm() - radius).abs() < 1e-5 and not torch.equal(image, heldout)
        if a is not b:
            cos = torch.dot(a[:2, 3], b[:2, 3]) / (a[:2, 3].norm() * b[:2, 3].norm())
            assert cos.item() == pytest.approx(math.cos(math.radians(15.0)), abs=1e-5)


def test_pyramid_rays_share_levels_and_match_the_downscaled_pixels():
    from tinn.errors import ConfigError
    from tinn.render import pixel_radius
    from tinn.scenes.training.octree_training import PyramidRays
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    views = render_views(ProceduralScene(), 3, 8, 8, seed=2, n_samples=32)
    rays = PyramidRays(views, 3)
    assert rays.counts.tolist() == [192, 48, 12]
    assert rays.level_counts(70) == [40, 20, 10] and rays.level_counts(3) == [1, 1, 1]
    origins, directions, colors, radius = rays.sample(700, torch.Generator(device=DEV).manual_seed(0))
    for k, want in enumerate(rays.level_counts(700)):
        level = views.downscaled(2 ** k)
        sel = radius == pixel_radius(level.focal)
        assert int(sel.sum()) == want
        lo, ld, lc = level.rays()
        nearest = torch.cdist(directions[sel], ld).argmin(dim=1)        # each sampled ray is a ray of this level
        assert torch.allclose(directions[sel], ld[nearest], atol=1e-6)
        assert torch.allclose(origins[sel], lo[nearest]) and torch.allclose(colors[sel], lc[nearest])
    with pytest.raises(ConfigError, match="pyramid_levels=5"):
        PyramidRays(views, 5)                       # 8 px images cannot be halved 4 times
    with pytest.raises(ConfigError, match="divisible by 4"):
        PyramidRays(render_views(ProceduralScene(), 1, 10, 10, n_samples=8), 3)
    with pytest.raises(ConfigError, match="pyramid_levels"):
        PyramidRays(views, 0)


def test_pyramid_rays_hold_colours_only_and_rebuild_each_drawn_ray_exactly():
    """A capture large enough for deep nodes (300 views at 1,600 px) would not fit a GPU with every ray stored:
    the pyramid keeps colours and coverage, and each drawn ray's origin and direction are computed from its camera
    and pixel, equal to `camera_rays` for that pixel (non-square, off-axis cameras, three levels)."""
    from tinn.render import pixel_radius
    from tinn.scenes.data.procedural import ProceduralScene, render_views
    from tinn.scenes.training.octree_training import PyramidRays, image_pyramid

    views = render_views(ProceduralScene(), 3, 12, 8, seed=4, n_samples=16)
    rays = PyramidRays(views, 3)
    levels = image_pyramid(views, 3)
    pixels = sum(len(level) * level.width * level.height for level in levels)
    # Nothing but tensors and plain values: no image kept beside the concatenated colours.
    assert all(isinstance(v, (torch.Tensor, int, float, tuple, type(None))) for v in vars(rays).values())
    held = sum(t.numel() * t.element_size() for t in vars(rays).values() if isinstance(t, torch.Tensor))
    assert held <= 12 * pixels + 4096        # the colours (12 bytes a pixel) and small per-level tables
    u = torch.rand(3 * 97, device=DEV, generator=torch.Generator(device=DEV).manual_seed(3))
    origins, directions, colors, radius, _ = rays.rays_at(u, 97)
    found = 0
    for level in levels:
        lo, ld, lc = (t.to(DEV).float() for t in level.rays())
        sel = torch.nonzero(radius == pixel_radius(level.focal)).squeeze(1)
        # Each drawn ray is the ray of the pixel whose colour it carries: its index from u, as rays_at draws it.
        count = len(level) * level.width * level.height
        local = torch.minimum((u[sel] * count).long(), torch.tensor(count - 1, device=DEV))
        assert torch.equal(colors[sel], lc[local])
        assert torch.allclose(origins[sel], lo[local], rtol=0, atol=1e-6)
        assert torch.allclose(directions[sel], ld[local], rtol=0, atol=2e-6)
        found += sel.numel()
    assert found == u.numel()


def test_finest_share_gives_the_full_resolution_its_fraction_of_every_batch():
    from tinn.errors import ConfigError
    from tinn.render import pixel_radius
    from tinn.scenes.training.octree_training import PyramidRays
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    views = render_views(ProceduralScene(), 2, 8, 8, seed=2, n_samples=32)
    rays = PyramidRays(views, 3, finest_share=0.8)
    # 80% full resolution; the other 20% split 2:1 between the half and the quarter resolution (rounded down,
    # the remainder to the full resolution).
    assert rays.level_counts(1000) == [801, 133, 66]
    _, _, _, radius = rays.sample(1000, torch.Generator(device=DEV).manual_seed(1))
    assert int((radius == pixel_radius(views.focal)).sum()) == 801
    assert PyramidRays(views, 1, finest_share=0.8).level_counts(10) == [10]   # one level takes the whole batch
    assert PyramidRays(views, 3, finest_share=1.0).level_counts(10) == [8, 1, 1]   # every level keeps a ray
    for bad in (0.0, 1.5, "half"):
        with pytest.raises(ConfigError, match="finest_share"):
            PyramidRays(views, 3, finest_share=bad)


def test_octree_trainer_gives_the_finest_nodes_most_of_every_batch_by_default():
    from tinn.scenes.training.octree_training import OctreeTrainer
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    field = blob_field(2)
    views = render_views(ProceduralScene(), 2, 8, 8, seed=2, n_samples=32)
    trainer = OctreeTrainer(field, views, pyramid_levels=3, n_samples=8, batch_rays=100)
    counts = trainer.rays.level_counts(trainer.batch_rays)
    assert counts[0] >= 80 and sum(counts) == 100 and min(counts) >= 1
    halving = OctreeTrainer(field, views, pyramid_levels=3, n_samples=8, batch_rays=70, finest_share=None)
    assert halving.rays.level_counts(70) == [40, 20, 10]


def test_octree_trainer_evaluates_each_batch_as_if_drawn_in_its_own_step():
    """The trainer draws and assigns the next step's batch before evaluating its own: the losses are those of
    drawing each batch in its step and rendering it with `render_rays` (the same random numbers in the same
    order), and one step's batch is left drawn ahead."""
    from tinn.scenes.training.octree_training import OctreeTrainer, photometric_loss
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    field = blob_field(4)
    views = render_views(ProceduralScene(), 2, 8, 8, seed=3, n_samples=32)
    ahead = OctreeTrainer(field, views, pyramid_levels=2, n_samples=12, batch_rays=64, seed=7)
    losses = [float(ahead.loss()) for _ in range(3)]
    assert ahead._ahead is not None
    plain = OctreeTrainer(field, views, pyramid_levels=2, n_samples=12, batch_rays=64, seed=7)
    expected = []
    for _ in range(3):
        origins, directions, colors, radius, alpha = plain.rays.sample_rgba(64, plain.generator)
        background = plain.background
        if plain.random_background:
            background = torch.rand(64, 3, device=colors.device, generator=plain.generator)
            colors = colors + (1.0 - alpha) * (background - plain.background)
        result = field.render_rays(origins, directions, radius, 12, jitter=True, background=background,
                                   generator=plain.generator)
        expected.append(float(photometric_loss(result.rgb, colors)))
    assert losses == expected and len(set(losses)) == 3


def test_level_dither_sends_training_samples_up_to_that_many_levels_finer():
    """The same batch (the dither's random numbers come after the others) assigned without and with
    `level_dither`: every sample that keeps a node sits at the same depth or up to ceil(dither) deeper, some
    deeper; the trainer draws exactly the old batch with the dither off; bad values are named."""
    from tinn.scenes.training.octree_training import MAX_LEVEL_DITHER, OctreeTrainer
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    field = blob_field(4)
    views = render_views(ProceduralScene(), 2, 8, 8, seed=3, n_samples=32)
    depth = field.octree.depth.long()

    def first_batch(dither):
        trainer = OctreeTrainer(field, views, pyramid_levels=2, n_samples=12, batch_rays=256, seed=7,
                                level_dither=dither, batches_per_draw=1)
        return trainer.draw_batch()

    plain_colors, _, plain = first_batch(0.0)
    again_colors, _, again = first_batch(0)
    assert torch.equal(plain.node, again.node) and torch.equal(plain_colors, again_colors)
    for dither in (1.0, 2.0):
        colors, _, dithered = first_batch(dither)
        assert torch.equal(colors, plain_colors)                     # the same rays
        both = (plain.node >= 0) & (dithered.node >= 0)
        deeper = depth[dithered.node[both].long()] - depth[plain.node[both].long()]
        assert int(deeper.min()) >= 0 and int(deeper.max()) <= math.ceil(dither)
        assert int((deeper > 0).sum()) > 0
    for bad in (-0.5, MAX_LEVEL_DITHER + 1, True, "1"):
        with pytest.raises(ConfigError, match="level_dither"):
            OctreeTrainer(field, views, level_dither=bad)


def test_octree_trainer_drawing_several_batches_at_once_trains_as_drawing_each_alone(tuned):
    """Batches drawn three at a time (one set of launches) give the losses and parameters of batches drawn one
    at a time, step by step through parameter updates; a bad count is refused by name."""
    from tinn.scenes.training.octree_training import OctreeTrainer

    tuned(deterministic=True)  # bit-identical runs on CUDA too (no float atomics)
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    views = render_views(ProceduralScene(), 2, 8, 8, seed=3, n_samples=32)
    runs = {}
    for per_draw in (1, 3):
        field = blob_field(4)
        trainer = OctreeTrainer(field, views, pyramid_levels=2, n_samples=12, batch_rays=48, seed=7,
                                batches_per_draw=per_draw)
        assert trainer.batches_per_draw == per_draw
        runs[per_draw] = ([float(trainer.step()) for _ in range(7)], field.model.state_dict())
    assert runs[1][0] == runs[3][0] and len(set(runs[1][0])) == 7
    for name, value in runs[1][1].items():
        assert torch.equal(value, runs[3][1][name]), name
    assert OctreeTrainer(blob_field(4), views, pyramid_levels=2, n_samples=12, batch_rays=48).batches_per_draw == 8
    for bad in (0, 2.0, True):
        with pytest.raises(ConfigError, match="batches_per_draw"):
            OctreeTrainer(blob_field(4), views, pyramid_levels=2, n_samples=12, batch_rays=48, batches_per_draw=bad)


def test_split_assigned_gives_each_batch_as_assigned_alone():
    from tinn.render import octree as octree_rendering

    field = blob_field(2)
    origins, directions = aimed_rays(30, seed=4)
    radius = torch.full((30,), 0.004, device=DEV)
    uniforms = torch.rand(30, 16, generator=torch.Generator().manual_seed(1)).to(DEV)
    together = octree_rendering.assign_rays(field, origins, directions, radius, 16, jitter=True, uniforms=uniforms)
    parts = octree_rendering.split_assigned(together, 3)
    assert len(parts) == 3 and sum(p.n_assigned.value() for p in parts) == together.n_assigned.value()
    for b, part in enumerate(parts):
        rows = slice(10 * b, 10 * (b + 1))
        alone = octree_rendering.assign_rays(field, origins[rows], directions[rows], radius[rows], 16, jitter=True,
                                             uniforms=uniforms[rows].contiguous())
        assert torch.equal(part.node, alone.node) and torch.equal(part.ray_offsets, alone.ray_offsets)
        assert torch.equal(part.deltas, alone.deltas)
        kept = alone.node.reshape(-1) >= 0
        assert torch.equal(part.local[kept], alone.local[kept])
        assert part.n_assigned.value() == alone.n_assigned.value() > 0
    with pytest.raises(InputError, match="n_batches=4"):
        octree_rendering.split_assigned(together, 4)
    with pytest.raises(InputError, match="uniforms must have shape"):
        octree_rendering.assign_rays(field, origins, directions, radius, 16, jitter=True, uniforms=uniforms[:, :8])


def test_marched_frames_do_not_depend_on_the_chunk_of_rays():
    field = blob_field(3)
    c2w = _look_at_origin(2.6)
    background = torch.tensor([0.3, 0.6, 0.9], device=DEV)
    whole = field.render_image(c2w, 12, 10, 12.0, 24, background=background, occupancy=None, segments=3)
    pieces = field.render_image(c2w, 12, 10, 12.0, 24, background=background, occupancy=None, segments=3, chunk=37)
    assert torch.equal(whole["image"], pieces["image"]) and torch.equal(whole["first_node"], pieces["first_node"])
    assert torch.equal(whole["touched"], pieces["touched"]) and whole["n_evaluated"] == pieces["n_evaluated"] > 0
    with pytest.raises(InputError, match="n_samples"):
        field.render_image(c2w, 4, 4, 12.0, 0)


def test_the_demos_full_size_decays_its_rate_from_a_captures_higher_start_and_the_small_size_keeps_it():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "demos"))
    import octree_lod

    full = octree_lod.parse_args(["--full"])
    octree_lod.apply_defaults(full, on_gpu=False)
    small = octree_lod.parse_args(["--small"])
    octree_lod.apply_defaults(small, on_gpu=False)
    assert (full.final_lr_factor, small.final_lr_factor) == (0.1, 1.0)
    # A capture's full-size octree starts at a higher rate (measured at 800 pixels); the rest at 1e-2.
    capture = octree_lod.parse_args(["--full", "--mesh", "bunny.obj"])
    octree_lod.apply_defaults(capture, on_gpu=False)
    small_capture = octree_lod.parse_args(["--small", "--mesh", "bunny.obj"])
    octree_lod.apply_defaults(small_capture, on_gpu=False)
    scale = octree_lod.parse_args(["--scale", "--mesh", "bunny.obj"])
    octree_lod.apply_defaults(scale, on_gpu=False)
    assert (capture.lr, full.lr, small.lr, small_capture.lr, scale.lr) == (3e-2, 1e-2, 1e-2, 1e-2, 3e-2)
    mine = octree_lod.parse_args(["--full", "--final-lr-factor", "0.5", "--lr", "0.02"])
    octree_lod.apply_defaults(mine, on_gpu=False)
    assert (mine.final_lr_factor, mine.lr) == (0.5, 0.02)
    # One decoder for every node in the scale preset (its deep trees measured better), a decoder per node elsewhere;
    # --decoder chooses either way.
    assert (scale.decoder, capture.decoder, full.decoder, small.decoder) == ("shared", "per-node", "per-node",
                                                                              "per-node")
    own = octree_lod.parse_args(["--scale", "--mesh", "bunny.obj", "--decoder", "per-node"])
    octree_lod.apply_defaults(own, on_gpu=False)
    shared = octree_lod.parse_args(["--full", "--decoder", "shared"])
    octree_lod.apply_defaults(shared, on_gpu=False)
    assert (own.decoder, shared.decoder) == ("per-node", "shared")
    # The scale preset gives the downscaled images half of each batch (its deep trees' coarse levels learn from
    # them); elsewhere the trainer's own share applies.
    assert (scale.finest_share, capture.finest_share, full.finest_share) == (0.5, None, None)
    with pytest.raises(SystemExit):
        octree_lod.parse_args(["--decoder", "one"])


def test_a_frame_with_more_samples_than_one_kernel_indexes_is_queried_in_pieces(monkeypatch):
    """One run of an 800-pixel frame with 256 samples a ray held 34 M samples, past what one kernel of the node
    array indexes: the field queries them in pieces of `QUERY_PIECE`, and the frame (image, first nodes, touched
    nodes) is the one a single query draws, bit for bit."""
    from tinn.scenes.fields import octree_field

    field = blob_field(3)
    c2w = torch.eye(4, device=DEV)
    c2w[2, 3] = 3.0
    whole = field.render_image(c2w, 24, 20, 30.0, 32, segments=1)
    assert whole["n_evaluated"] > 1000
    monkeypatch.setattr(octree_field, "QUERY_PIECE", 97)
    pieces = field.render_image(c2w, 24, 20, 30.0, 32, segments=1)
    assert torch.equal(pieces["image"], whole["image"]) and torch.equal(pieces["first_node"], whole["first_node"])
    assert torch.equal(pieces["touched"], whole["touched"]) and pieces["n_evaluated"] == whole["n_evaluated"]


def test_an_octree_field_with_a_shared_decoder_trains_one_mlp_for_every_node():
    """`shared_decoder=True`: a grid per node and one MLP; the MLP's gradient gathers every node's samples, and a
    few steps lower the loss as a field with a decoder per node does."""
    from tinn.errors import ConfigError
    from tinn.scenes.fields.octree_field import OctreeField
    from tinn.scenes.training.octree_training import OctreeTrainer
    from tinn.scenes.data.procedural import ProceduralScene, render_views

    tree = blob_field(1).octree
    field = OctreeField(tree, TINY_ENCODING, TINY_NETWORK, seed=6, shared_decoder=True)
    assert field.model.network.params.shape[0] == 1 and field.model.encoding.params.shape[0] == tree.n_nodes
    views = render_views(ProceduralScene(), 4, 12, 12, seed=2, n_samples=32)
    trainer = OctreeTrainer(field, views, pyramid_levels=2, n_samples=16, batch_rays=256)
    losses = [float(trainer.step()) for _ in range(40)]
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
    assert field.model.network.params.grad is not None and bool(field.model.network.params.grad.abs().sum() > 0)
    with pytest.raises(ConfigError, match="shared_decoder"):
        OctreeField(tree, TINY_ENCODING, TINY_NETWORK, shared_decoder="yes")

"""The octree's capacity rule (tinn/scenes/acceleration/octree_budget.py) and the level-of-detail evaluation against an
area-filtered ground truth (tinn/scenes/training/lod_eval.py)."""
import math

import numpy as np
import pytest
import torch

import tinn
from tinn.errors import ConfigError, InputError
from tinn.scenes.training import lod_eval
from tinn.scenes.data import mesh as M
from tinn.scenes.data import PosedImages
from tinn.scenes.acceleration.octree import Octree
from tinn.scenes.acceleration.octree_budget import (DEFAULT_MIN_LEAF_RESOLUTION, MAX_FILL_LEVELS, MIN_LEVEL_SCALE,
                                                    budget_encoding, capture_depth, closest_footprint,
                                                    grid_levels_for, leaf_resolution, node_params)
from tinn.scenes.fields.octree_field import OctreeField, finest_grid_resolution

NETWORK = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 16,
           "n_hidden_layers": 1}


# The seam tests index a field with CPU tensors directly (its private local query included); the budget and
# evaluation tests are device-free and run on any arch.
cpu_tensors = pytest.mark.skipif(tinn.runtime.device().type != "cpu",
                                 reason="indexes the field with CPU tensors; runs in the CPU suite")


def views(focal: float, distance: float = 4.0, width: int = 8) -> PosedImages:
    """Two posed (blank) views at `distance` from the origin looking at it; only their geometry matters here."""
    c2w = torch.stack([torch.as_tensor(M.look_at(p), dtype=torch.float32)
                       for p in ([0.0, -distance, 0.5], [distance * 1.5, 0.0, 0.0])])
    return PosedImages(images=torch.zeros(2, width, width, 3), c2w=c2w, focal=focal, width=width, height=width,
                       near=1.0, far=8.0, box_min=torch.full((3,), -1.5), box_max=torch.full((3,), 1.5),
                       background=torch.ones(3))


def sphere_tree(depth: int) -> Octree:
    g = torch.Generator().manual_seed(0)
    p = torch.randn(4000, 3, generator=g)
    p = p / p.norm(dim=1, keepdim=True)
    return Octree.build(p, torch.full((3,), -1.5), torch.full((3,), 1.5), depth, 4)


# ---- capacity: the deepest nodes get cells as wide as the closest view's footprint ----------------------------

def test_closest_footprint_is_the_nearest_views_farthest_in_box_sample():
    v = views(focal=100.0)
    half_diagonal = math.sqrt(3 * 1.5 ** 2)
    expected = (math.sqrt(4.0 ** 2 + 0.5 ** 2) + half_diagonal) * 0.5 / 100.0
    assert closest_footprint(v) == pytest.approx(expected, rel=1e-6)


def axis_views(distances, focal: float = 8.0, width: int = 8) -> PosedImages:
    """Blank views on the -y axis at `distances` from the origin, looking at it."""
    c2w = torch.stack([torch.as_tensor(M.look_at([0.0, -d, 0.0]), dtype=torch.float32) for d in distances])
    n = len(distances)
    return PosedImages(images=torch.zeros(n, width, width, 3), c2w=c2w, focal=focal, width=width, height=width,
                       near=0.1, far=8.0, box_min=torch.full((3,), -1.5), box_max=torch.full((3,), 1.5),
                       background=torch.ones(3))


def test_surface_footprint_is_a_quantile_of_where_the_views_meet_the_hull():
    """A cube hull seen face on: every ray that meets it meets the front face, at the view's distance less the
    face's (voxel-aligned) offset; the nearest hit is the closest view's; a quantile picks among the hits of all
    views pooled, so one close view among many farther ones does not set the footprint alone."""
    from tinn.scenes.acceleration.occupancy import OccupancyGrid
    from tinn.scenes.acceleration.octree_budget import surface_footprint
    from tinn.render import pixel_radius

    r = 32
    centres = (torch.arange(r) + 0.5) * (3.0 / r) - 1.5
    inside = centres.abs() <= 0.5
    hull = OccupancyGrid(inside[:, None, None] & inside[None, :, None] & inside[None, None, :],
                         torch.full((3,), -1.5), torch.full((3,), 1.5))
    face = -1.5 + int(inside.nonzero()[0]) * 3.0 / r            # the first occupied voxel's near side
    for distances in ((4.0,), (4.0, 2.5), (2.5, 4.0)):
        v = axis_views(distances)
        expected = (min(distances) + face) * pixel_radius(v.focal)
        assert surface_footprint(v, hull, quantile=0.0) == pytest.approx(expected, rel=3e-3)
    # Off-axis rays meet the face farther along them: the median lies beyond the nearest hit.
    v = axis_views((4.0,))
    near, median, far = (surface_footprint(v, hull, quantile=q) for q in (0.0, 0.5, 1.0))
    assert near < median < far
    # The farthest hit is a ray through the face's rim: distance / cos of its angle.
    rim = (4.0 + face) * math.sqrt(1 + 2 * (-face / (4.0 + face)) ** 2) * pixel_radius(v.focal)
    assert far == pytest.approx(rim, rel=0.08)
    assert far < closest_footprint(v)     # the box rule's farthest in-box point lies behind the surface
    # One view at 2.5 among eight at 4: the close view sees the face about three times as large, so about a
    # quarter of the hits are its own. Its rim bounds them; the pooled median lies among the far views' hits, the
    # tenth part among the close view's.
    pooled = axis_views((2.5,) + (4.0,) * 8)
    close_rim = (2.5 + face) * math.sqrt(1 + 2 * (-face / (2.5 + face)) ** 2) * pixel_radius(pooled.focal)
    assert surface_footprint(pooled, hull, quantile=0.1) < close_rim
    assert (4.0 + face) * pixel_radius(pooled.focal) < surface_footprint(pooled, hull, quantile=0.5) < rim * 1.01
    assert surface_footprint(pooled, hull, quantile=0.0) == pytest.approx((2.5 + face) * pixel_radius(pooled.focal),
                                                                          rel=3e-3)
    with pytest.raises(InputError, match="quantile"):
        surface_footprint(v, hull, quantile=2.0)
    with pytest.raises(InputError, match="hull must be an OccupancyGrid"):
        surface_footprint(v, hull.occupied)
    with pytest.raises(InputError, match="rays_per_side"):
        surface_footprint(v, hull, rays_per_side=0)
    with pytest.raises(InputError, match="no view"):
        surface_footprint(v, OccupancyGrid(torch.zeros(r, r, r, dtype=torch.bool), torch.full((3,), -1.5),
                                           torch.full((3,), 1.5)))


def test_a_per_node_budget_grows_the_array_with_the_tree_and_a_given_footprint_sets_the_depth():
    from tinn.scenes.acceleration.octree_budget import budgeted_octree

    g = torch.Generator().manual_seed(0)
    p = torch.randn(6000, 3, generator=g)
    points = 0.9 * p / p.norm(dim=1, keepdim=True)
    v = views(focal=1111.0)
    edge = 3.0
    for depth in (1, 2, 3):
        footprint = edge / (DEFAULT_MIN_LEAF_RESOLUTION * 2 ** depth) * 0.999   # feeds exactly `depth`
        built = budgeted_octree(v, 40_000, NETWORK, footprint=footprint, per_node=True, points=points,
                                min_points=4)
        assert built.depth == depth and built.tree.deepest == depth
        total = built.tree.n_nodes * node_params(built.encoding, NETWORK)
        assert 40_000 * built.tree.n_nodes / 2 < total <= 40_000 * built.tree.n_nodes
    shared = budgeted_octree(v, 1_000_000, NETWORK, footprint=footprint, points=points, min_points=4)
    assert 500_000 < shared.tree.n_nodes * node_params(shared.encoding, NETWORK) <= 1_000_000
    with pytest.raises(ConfigError, match="footprint"):
        budgeted_octree(v, 40_000, NETWORK, footprint=-1.0, points=points)


def test_budget_gives_the_deepest_nodes_cells_of_the_footprint_and_fits_the_budget():
    tree = sphere_tree(3)
    v = views(focal=1111.0)                        # an 800-pixel view's focal
    footprint = closest_footprint(v)
    rule = leaf_resolution(tree, footprint)
    assert tree.edge / (rule * 2 ** tree.deepest) == pytest.approx(footprint, rel=2e-6)
    budget = 40_000 * tree.n_nodes
    enc = budget_encoding(tree.n_nodes, budget, 2 * rule, NETWORK, fill_levels=False)
    # The grid reaches the finest resolution asked for, growing by at most 2 per level.
    assert finest_grid_resolution(enc) == pytest.approx(2 * rule, rel=1e-6)
    assert enc["per_level_scale"] <= 2.0 and grid_levels_for(2 * rule)[0] == enc["n_levels"]
    # The largest table within the budget: the next size up would pass it.
    assert tree.n_nodes * node_params(enc, NETWORK) <= budget
    bigger = dict(enc, log2_hashmap_size=enc["log2_hashmap_size"] + 1)
    assert tree.n_nodes * node_params(bigger, NETWORK) > budget
    # node_params counts what the field allocates.
    field = OctreeField(tree, dict(enc, log2_hashmap_size=10), NETWORK, lod_resolution=rule)
    assert field.n_params() == tree.n_nodes * node_params(dict(enc, log2_hashmap_size=10), NETWORK)
    # Every full-resolution sample of the closest view, up to its farthest in-box point, selects the deepest
    # nodes; a sample with 1.5 times that footprint selects the depth above.
    surface = tree.points[:64]
    radius = torch.full((64,), footprint)
    assert (tree.depth[field.select_nodes(surface, radius).long()] == tree.deepest).all()
    assert (tree.depth[field.select_nodes(surface, 1.5 * radius).long()] == tree.deepest - 1).all()


def test_the_old_fixed_grid_left_the_deepest_nodes_coarser_than_an_800_pixel_footprint():
    # The demo's fixed node grid (3 levels, resolutions 2..8) at depth 4: cells of edge / 128, while an 800-pixel
    # view's footprint asks for about edge / 1000; the budget rule gives the cells the footprint's width.
    tree = sphere_tree(4)
    footprint = closest_footprint(views(focal=1111.0))
    fixed_cell = tree.edge / (8 * 2 ** tree.deepest)
    assert fixed_cell > 5 * footprint
    enc = budget_encoding(tree.n_nodes, 20_000_000, 2 * leaf_resolution(tree, footprint), NETWORK)
    assert tree.edge / (finest_grid_resolution(enc) * 2 ** tree.deepest) == pytest.approx(footprint / 2, rel=3e-6)


def test_capture_depth_stops_where_nodes_would_get_too_few_cells():
    edge, footprint = 3.0, 3.0 / 1000            # 1000 footprints across the root
    assert capture_depth(edge, footprint, 16.0) == 5       # 1000 / 32 = 31 >= 16, 1000 / 64 = 15.6 < 16
    assert capture_depth(edge, footprint, 1000.0) == 0
    assert capture_depth(edge, footprint, 16.0, limit=3) == 3


def test_an_800_pixel_capture_stops_the_tree_at_depth_1_and_depth_3_has_four_times_the_table_of_depth_4():
    # The synthetic views' geometry is the mesh captures' (about 1000 footprints across the root at 800 pixels).
    v = views(focal=1111.0)
    footprint = closest_footprint(v)
    edge = 2 * 1.5
    depth = capture_depth(edge, footprint)
    assert depth == 1 and capture_depth(edge, footprint, 128.0) == 2 and capture_depth(edge, footprint, 64.0) == 3
    assert edge / (footprint * 2 ** depth) >= DEFAULT_MIN_LEAF_RESOLUTION > edge / (footprint * 2 ** (depth + 1))
    # Within the teacher's budget (16 levels x 2^19) the bunny's depth-3 tree (132 nodes) gets 2^13 entries per
    # level, its depth-4 tree (627 nodes) 2^11.
    network = dict(NETWORK, n_neurons=32)
    teacher = 12_427_792
    deep = budget_encoding(627, teacher, 2 * edge / (footprint * 16), network, fill_levels=False)
    shallow = budget_encoding(132, teacher, 2 * edge / (footprint * 8), network, fill_levels=False)
    assert (deep["log2_hashmap_size"], shallow["log2_hashmap_size"]) == (11, 13)
    assert shallow["n_levels"] == deep["n_levels"] + 1       # twice the cells per node edge: one level more
    assert 132 * node_params(shallow, network) <= teacher


def test_filling_the_budget_adds_levels_between_the_same_resolutions_and_stays_within_it():
    network = dict(NETWORK, n_neurons=32)
    teacher = 12_427_792
    for n_nodes, finest in ((1, 2021.0), (9, 1010.0), (37, 505.0), (132, 252.0)):
        bare = budget_encoding(n_nodes, teacher, finest, network, fill_levels=False)
        filled = budget_encoding(n_nodes, teacher, finest, network)
        # Same table and the same coarsest and finest resolutions; the spare budget became levels.
        assert filled["log2_hashmap_size"] == bare["log2_hashmap_size"]
        assert finest_grid_resolution(filled) == pytest.approx(finest, rel=1e-6)
        assert filled["base_resolution"] == bare["base_resolution"]
        assert bare["n_levels"] <= filled["n_levels"] <= MAX_FILL_LEVELS
        assert filled["per_level_scale"] >= MIN_LEVEL_SCALE
        used = n_nodes * node_params(filled, network)
        assert n_nodes * node_params(bare, network) <= used <= teacher
        # It stops only at a limit: one level more would pass the budget, the level cap or the finest spacing.
        more = filled["n_levels"] + 1
        denser = dict(filled, n_levels=more, per_level_scale=(finest / filled["base_resolution"]) ** (1 / (more - 1)))
        assert (more > MAX_FILL_LEVELS or denser["per_level_scale"] < MIN_LEVEL_SCALE
                or n_nodes * node_params(denser, network) > teacher)
    # One node of 2^19 entries (the table's cap) used less than half of the teacher's budget before.
    bare, filled = (budget_encoding(1, teacher, 2021.0, network, fill_levels=f) for f in (False, True))
    assert node_params(bare, network) < 0.5 * teacher < node_params(filled, network)


def test_budget_bad_input():
    with pytest.raises(ConfigError, match="param_budget"):
        budget_encoding(100, 10, 32.0, NETWORK)
    with pytest.raises(ConfigError, match="n_nodes"):
        budget_encoding(0, 10 ** 6, 32.0, NETWORK)
    with pytest.raises(ConfigError, match="fill_levels"):
        budget_encoding(1, 10 ** 6, 32.0, NETWORK, fill_levels="yes")
    with pytest.raises(InputError, match="footprint"):
        leaf_resolution(sphere_tree(1), 0.0)


# ---- level-of-detail evaluation: the truth is the area average of each pixel ----------------------------------

def test_area_filter_of_a_ramp_and_a_checkerboard_equals_their_analytic_pixel_averages():
    width, height, s = 6, 4, 4

    def ramp(w, h, focal):                       # f = x at each fine pixel centre, in coarse-pixel units
        x = (torch.arange(w, dtype=torch.float64) + 0.5) / s
        return x.expand(h, w)[..., None].float()

    out = lod_eval.area_filtered(ramp, width, height, 10.0, s)
    # A linear function's average over a pixel is its value at the pixel centre.
    expected = (torch.arange(width) + 0.5).float().expand(height, width)[..., None]
    torch.testing.assert_close(out, expected)

    def checker(w, h, focal):                    # period of one fine pixel: every coarse pixel averages to 1/2
        i = torch.arange(h)[:, None] + torch.arange(w)[None, :]
        return (i % 2).float()[..., None]

    torch.testing.assert_close(lod_eval.area_filtered(checker, width, height, 10.0, s),
                               torch.full((height, width, 1), 0.5))


def test_mesh_truth_is_the_covered_area_of_each_pixel():
    # A square of half-side 1 at distance 3: its right edge projects to focal / 3 pixels from the centre. Put it a
    # quarter pixel into a pixel: that pixel's truth is a quarter of the square's colour, three quarters background.
    res, focal = 16, 3 * (3 + 0.25)
    v = np.array([[-1, -1, 0], [1, -1, 0], [1, 1, 0], [-1, 1, 0]], np.float32)
    f = np.array([[0, 1, 2], [0, 2, 3]], np.int32)
    colour = np.array([0.2, 0.6, 1.0], np.float32)
    mesh = M.Mesh(v, f, np.tile(colour, (2, 3)))
    background = torch.tensor([1.0, 1.0, 1.0])
    truth = lod_eval.mesh_truth(mesh, background, supersample=4, ambient=1.0)
    c2w = torch.eye(4)
    c2w[2, 3] = 3.0
    image = truth(c2w, res, res, focal).cpu()
    row = res // 2
    torch.testing.assert_close(image[row, res // 2 + 2], torch.from_numpy(colour))   # inside
    torch.testing.assert_close(image[row, res // 2 + 3], 0.25 * torch.from_numpy(colour) + 0.75 * background)
    torch.testing.assert_close(image[row, res // 2 + 4], background)


def test_pulled_back_camera_and_central_window():
    c2w = torch.as_tensor(M.look_at([0.0, -4.0, 1.0]), dtype=torch.float32)
    far = lod_eval.pulled_back(c2w, 4.0, torch.tensor([0.0, 0.0, 1.0]))
    torch.testing.assert_close(far[:3, 3], torch.tensor([0.0, -16.0, 1.0]))
    torch.testing.assert_close(far[:3, :3], c2w[:3, :3])
    image = torch.arange(64.0).view(8, 8, 1)
    window = lod_eval.central_window(image, 4.0)
    assert window.shape == (2, 2, 1) and window[0, 0, 0] == 3 * 8 + 3
    assert lod_eval.window_psnr(image, image + 0.1, 4.0) == pytest.approx(20.0, abs=1e-4)
    with pytest.raises(InputError, match="factor"):
        lod_eval.pulled_back(c2w, 0.0)
    with pytest.raises(InputError, match="supersample"):
        lod_eval.area_filtered(lambda w, h, f: torch.zeros(h, w, 3), 2, 2, 1.0, 0)


@cpu_tensors
def test_lod_curve_pools_its_views_squared_errors_and_shows_every_window():
    """Several poses: each row's PSNR is that of the views' mean squared error on the object's window (as
    `evaluate` pools views), each view's own PSNR is listed, and `on_frame` sees every (factor, view) window."""
    field = octant_field(0.0)
    c2w = views(8.0).c2w
    tint = torch.tensor([0.2, 0.5, 0.9])

    def truth(pose, width, height, focal):  # a flat colour per pose, so each view has its own error
        return (tint * (1 + float(pose[0, 3] != 0))).expand(height, width, 3).clone()

    seen = []
    on_frame = lambda factor, view, pred, target: seen.append((factor, view, pred.clone(), target.clone()))  # noqa
    rows = lod_eval.lod_curve(field, truth, c2w, 8, 8, 8.0, 16, factors=(1, 2), background=torch.ones(3),
                              on_frame=on_frame)
    assert [(f, v) for f, v, _, _ in seen] == [(1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1)]
    for row in rows:
        errors = [float(((p - t) ** 2).mean()) for f, _, p, t in seen if f == row["factor"]]
        assert row["psnr_per_view"] == pytest.approx([-10 * math.log10(e) for e in errors], rel=1e-6)
        assert row["psnr"] == pytest.approx(-10 * math.log10(sum(errors) / 2), rel=1e-6)
        assert row["window"] == list(seen[0 if row["factor"] == 1 else 2][2].shape[:2])
    assert rows[1]["window"] == [4, 4]
    single = lod_eval.lod_curve(field, truth, c2w[1], 8, 8, 8.0, 16, factors=(2,), background=torch.ones(3))
    assert single[0]["psnr"] == pytest.approx(rows[1]["psnr_per_view"][1], rel=1e-6)
    with pytest.raises(InputError, match="pose"):
        lod_eval.lod_curve(field, truth, c2w[:0], 8, 8, 8.0, 16)



@cpu_tensors
def test_lod_curve_reports_each_views_distance_and_level():
    """Views at two distances from the centre (a capture on rings of two radii): each row lists every view's
    distance and the level the rule picks for it, and names the nearest distance and the deepest level."""
    from tinn.render.rays import pixel_radius
    from tinn.scenes.acceleration.octree import levels_for_radius

    field = octant_field(0.0)
    c2w = views(8.0).c2w.clone()
    centre = (field.octree.box_min + field.octree.box_max) / 2
    offset = c2w[1, :3, 3] - centre  # the second view three times as far as the first
    c2w[1, :3, 3] = centre + offset / offset.norm() * 3 * (c2w[0, :3, 3] - centre).norm()
    truth = lambda pose, width, height, focal: torch.zeros(height, width, 3)  # noqa: E731
    rows = lod_eval.lod_curve(field, truth, c2w, 8, 8, 8.0, 16, factors=(1, 2), background=torch.ones(3))
    for row in rows:
        near, far = row["distances"]
        assert far == pytest.approx(3 * near, rel=1e-5) and row["distance"] == near
        radius = torch.tensor(row["distances"]) * pixel_radius(8.0)
        want = levels_for_radius(radius, field.lod_root_size).clamp(max=field.octree.deepest).tolist()
        assert row["levels"] == want and row["level"] == max(want)
    table = lod_eval.format_curve([dict(rows[0], levels=[1, 3], level=3)]).splitlines()[1].split()
    assert table[2] == "1-3"

# ---- seams: blending across node faces makes the field continuous ---------------------------------------------

def octant_field(blend_margin: float) -> OctreeField:
    corners = torch.tensor([[x, y, z] for x in (-0.5, 0.5) for y in (-0.5, 0.5) for z in (-0.5, 0.5)])
    tree = Octree.build(corners, torch.full((3,), -1.0), torch.full((3,), 1.0), 1, 0)
    enc = {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
           "base_resolution": 2, "per_level_scale": 2.0}
    field = OctreeField(tree, enc, NETWORK, lod_resolution=4.0, seed=3, blend_margin=blend_margin)
    with torch.no_grad():  # a grid table far from zero, so two nodes' fields differ clearly
        for p in field.model.parameters():
            p.uniform_(-1.0, 1.0)
    return field


@torch.no_grad()
def field_at(field: OctreeField, points: torch.Tensor):
    ids = field.select_nodes(points, torch.zeros(points.shape[0]))
    return field.query(points, ids), ids


@cpu_tensors
def test_blended_field_is_continuous_across_a_node_face_and_unblended_one_jumps():
    yz = torch.tensor([[0.3, 0.45], [0.7, 0.2], [0.45, 0.55]])             # off the other faces' bands
    eps = 1e-4
    left = torch.cat([torch.full((3, 1), -eps), yz], 1)
    right = torch.cat([torch.full((3, 1), eps), yz], 1)
    for margin, continuous in ((0.0, False), (0.1, True)):
        field = octant_field(margin)
        (sl, cl), il = field_at(field, left)
        (sr, cr), ir = field_at(field, right)
        assert (il != ir).all()                                               # two nodes meet at x = 0
        jump = float((sl - sr).abs().max() / sl.abs().max()) + float((cl - cr).abs().max())
        assert (jump < 1e-2) == continuous, (margin, jump)


@cpu_tensors
def test_blend_weights_inside_the_band_and_own_node_outside():
    field = octant_field(0.2)
    # x = -0.05: local x = 0.95 in the node [-1, 0], 0.05 from its face (a quarter of the band): own weight
    # 1/2 + 0.05 / 0.4 = 0.625 on that axis, the node across the face the rest; y and z are outside every band.
    p = torch.tensor([[-0.05, 0.5, 0.5]])
    (sigma, rgb), ids = field_at(field, p)
    across = field.octree.lookup(torch.tensor([[0.05, 0.5, 0.5]]), 1)
    own_s, own_c = field._query_local(field.octree.local_coords(p, ids).clamp(0, 1), ids)
    other_s, other_c = field._query_local(field.octree.local_coords(p, across).clamp(0, 1), across)
    torch.testing.assert_close(sigma, 0.625 * own_s + 0.375 * other_s)
    torch.testing.assert_close(rgb, 0.625 * own_c + 0.375 * other_c)
    centre = torch.tensor([[-0.5, 0.5, 0.5]])
    (sigma, rgb), ids = field_at(field, centre)
    own_s, own_c = field._query_local(field.octree.local_coords(centre, ids), ids)
    torch.testing.assert_close(sigma, own_s)
    with pytest.raises(ConfigError, match="blend_margin"):
        octant_field(0.5)


# ---- the tree over a capture's visual hull keeps every node that holds some of the object --------------------

WUSON = "/usr/share/assimp/models/OBJ/WusonOBJ.obj"   # Debian package assimp-testmodels


def test_the_hull_octree_prunes_none_of_the_surface_where_voxel_centres_alone_pruned_some(tmp_path):
    import os

    from conftest import missing_package
    from tinn.scenes.acceleration.octree import Octree
    from tinn.scenes.data.formats import load_scene
    from tinn.scenes.training.octree_training import foreground_points, hull_octree

    if not os.path.isfile(WUSON):
        missing_package(f"{WUSON} missing (Debian package assimp-testmodels)")
    dev = tinn.runtime.device()
    train = load_scene(M.scene_from_mesh(WUSON, tmp_path / "scene", 24, 0, 64), "train").to(dev)
    surface = M.read_mesh(WUSON).normalised().surface_points(50_000).to(dev)
    depth = 2
    # The former rule: 8 voxel centres per leaf edge, undilated. A leaf holding only a sliver of the surface
    # (between centres) was pruned, and that surface rendered as background.
    centres = foreground_points(train, resolution=8 * 2 ** depth)
    former = Octree.build(centres.float(), train.box_min.to(dev), train.box_max.to(dev), depth, 8)
    lost = float((former.lookup(surface, depth) < 0).float().mean())
    assert lost > 0.01, lost
    tree = hull_octree(train, depth, min_points=8)
    assert tree.deepest == depth and tree.n_nodes > former.n_nodes
    assert bool((tree.lookup(surface, depth) >= 0).all())
    # Still a pruned tree: leaves only around the object, not all 64 octants.
    assert tree.nodes_per_level()[depth] < 0.5 * 8 ** depth
    with pytest.raises(ConfigError, match="depth"):
        hull_octree(train, -1)


def test_dilated_hull_adds_exactly_the_voxels_next_to_kept_ones(tmp_path):
    from tinn.scenes.data.procedural import ProceduralScene, render_views
    from tinn.scenes.training.octree_training import foreground_points

    views = render_views(ProceduralScene(), 12, 24, 24, seed=0, n_samples=32)
    resolution = 16
    kept = foreground_points(views, resolution=resolution).cpu()
    dilated = foreground_points(views, resolution=resolution, dilate=1).cpu()
    lo = views.box_min.float().cpu()
    voxel = (views.box_max.float().cpu() - lo) / resolution

    def cells(p):
        return torch.round((p - lo) / voxel - 0.5).long()

    a, b = cells(kept), cells(dilated)
    grid = torch.zeros((resolution,) * 3, dtype=torch.bool)
    grid[a[:, 0], a[:, 1], a[:, 2]] = True
    expected = torch.zeros_like(grid)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dz in (-1, 0, 1):
                c = a + torch.tensor([dx, dy, dz])
                inside = ((c >= 0) & (c < resolution)).all(dim=1)
                expected[c[inside, 0], c[inside, 1], c[inside, 2]] = True
    got = torch.zeros_like(grid)
    got[b[:, 0], b[:, 1], b[:, 2]] = True
    assert b.shape[0] == int(got.sum())                       # each voxel once
    assert torch.equal(got, expected) and int(got.sum()) > int(grid.sum())
    for bad in (-1, resolution, 1.5, True):
        with pytest.raises(ConfigError, match="dilate"):
            foreground_points(views, resolution=resolution, dilate=bad)


def test_budgeted_octree_chains_the_capture_depth_the_hull_and_the_budget():
    from tinn.scenes.acceleration.octree import cube_around
    from tinn.scenes.acceleration.octree_budget import budgeted_octree
    from tinn.scenes.data.procedural import ProceduralScene, render_views, surface_points
    from tinn.scenes.training.octree_training import hull_octree

    images = render_views(ProceduralScene(), 12, 48, 48, seed=0, n_samples=32)
    footprint = closest_footprint(images)
    edge = cube_around(images.box_min.float(), images.box_max.float())[1]
    budget = 3_000_000
    built = budgeted_octree(images, budget, NETWORK, max_depth=3, min_leaf_resolution=8.0)
    assert built.depth == min(3, capture_depth(edge, footprint, 8.0)) >= 1
    hull = hull_octree(images, built.depth)
    assert torch.equal(built.tree.children, hull.children)                   # the same hull and tree
    assert built.lod_resolution == pytest.approx(leaf_resolution(built.tree, footprint))
    assert finest_grid_resolution(built.encoding) == pytest.approx(2.0 * built.lod_resolution, rel=1e-6)
    assert built.tree.n_nodes * node_params(built.encoding, NETWORK) <= budget
    # min_leaf_resolution 0: the depth limit alone; a given lod_resolution replaces the rule's; points replace
    # the hull; encoding options reach budget_encoding.
    deep = budgeted_octree(images, budget, NETWORK, max_depth=2, min_leaf_resolution=0)
    assert deep.depth == 2
    fixed = budgeted_octree(images, budget, NETWORK, max_depth=1, lod_resolution=5.0, oversample=3.0,
                            fill_levels=False, n_features=4)
    assert fixed.lod_resolution == 5.0 and finest_grid_resolution(fixed.encoding) == pytest.approx(15.0, rel=1e-6)
    assert fixed.encoding["n_features_per_level"] == 4
    points = surface_points(ProceduralScene(), 2000, seed=3).to(images.box_min.device)
    from_points = budgeted_octree(images, budget, NETWORK, max_depth=2, min_leaf_resolution=0, points=points,
                                  min_points=4)
    assert torch.equal(from_points.tree.children,
                       Octree.build(points, images.box_min, images.box_max, 2, 4).children)
    with pytest.raises(ConfigError, match="oversample"):
        budgeted_octree(images, budget, NETWORK, oversample=0.0)


def test_evaluate_reports_psnr_per_sphere_only_for_views_on_a_few_spheres():
    """Held-out PSNR per camera distance for views on spheres (each distance's views pooled, equal to `psnr` over
    them); none for views on one sphere, nor for views that each stand at their own distance."""
    from tinn.scenes.acceleration.octree import Octree
    from tinn.scenes.fields.octree_field import OctreeField
    from tinn.scenes.training.octree_training import evaluate, views_by_distance
    from tinn.tasks.image import psnr

    dev = tinn.runtime.device()
    tree = Octree.build(torch.zeros(1, 3, device=dev), torch.full((3,), -1.5, device=dev),
                        torch.full((3,), 1.5, device=dev), max_depth=0, min_points=1)
    field = OctreeField(tree, {"otype": "HashGrid", "n_levels": 2, "n_features_per_level": 2, "log2_hashmap_size": 8,
                               "base_resolution": 2, "per_level_scale": 2.0},
                        {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
                         "n_neurons": 16, "n_hidden_layers": 1})
    rings = axis_views((2.5, 4.0, 2.5, 4.0))
    rings.images[:] = torch.rand(rings.images.shape, generator=torch.Generator().manual_seed(0))
    assert views_by_distance(rings) == {"2.5": [0, 2], "4": [1, 3]}
    result = evaluate(field, rings, 8, occupancy=None)
    truth = rings.images.to(result["renders"].device)
    assert result["psnr_by_distance"] == {d: pytest.approx(psnr(result["renders"][v], truth[v]))
                                          for d, v in (("2.5", [0, 2]), ("4", [1, 3]))}
    assert evaluate(field, axis_views((4.0, 4.0)), 8, occupancy=None)["psnr_by_distance"] == {}
    assert evaluate(field, axis_views((2.5, 3.0, 3.5, 4.0)), 8, occupancy=None)["psnr_by_distance"] == {}

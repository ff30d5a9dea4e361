"""Octree level-of-detail scene: one tiny network (hash grid + MLP) per octree node, InfNeRF-style.

    python demos/octree_lod.py                       # procedural scene, full size on a GPU (a few minutes)
    python demos/octree_lod.py --small               # CPU-sized run (the default without a GPU)
    python demos/octree_lod.py --data path/to/nerf_synthetic/lego --res 100
    python demos/octree_lod.py --scale               # a mesh's close-up capture in ~700 nodes (glmark2's bunny)
    python demos/octree_lod.py --small --gui --headless   # the training viewer, frames in --out
    python demos/octree_lod.py --viewer web               # the viewer as a page: http://127.0.0.1:8080
    torchrun --nproc_per_node 2 demos/octree_lod.py --shard [--small]   # nodes sharded over 2 GPUs (gloo on CPUs)

The octree is built over the scene's surface points (procedural scene) or its visual hull (--data);
every node owns a network. Each sample picks a node by its footprint (t * pixel radius), so rays from
coarse pyramid levels train coarse nodes and a far camera renders from coarse nodes only. After training,
an occupancy grid per octree depth is built for rendering (empty-space skipping; early ray termination
too). Prints and returns held-out PSNR (full resolution, a coarser pyramid level, and with every sample
evaluated), training time, render time and fps (with skipping, and with every sample), memory, nodes per
level and the share of nodes and parameter bytes a frame touches (near and far camera).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tinn  # noqa: E402
from tinn.distributed import start_script  # noqa: E402
from tinn.progress import ProgressBar  # noqa: E402
from tinn.viewer.cli import add_viewer_args, open_viewer, viewer_kind  # noqa: E402
from tinn.trainer import TrainerControls  # noqa: E402

FULL = {"views": 100, "test_views": 8, "res": 128, "max_depth": 4, "min_points": 8, "steps": 5000,
        "pyramid_levels": 5, "samples": 128, "batch": 8192, "n_points": 200_000, "grid_levels": 3,
        "grid_features": 4, "neurons": 32, "occupancy_res": 128, "final_lr_factor": 0.1, "lr": 1e-2,
        "hull_res": 128}
SMALL = {"views": 24, "test_views": 4, "res": 32, "max_depth": 3, "min_points": 16, "steps": 250,
         "pyramid_levels": 3, "samples": 48, "batch": 1024, "n_points": 3000, "grid_levels": 3,
         "grid_features": 2, "neurons": 16, "occupancy_res": 64, "final_lr_factor": 1.0, "lr": 1e-2,
         "hull_res": 32}
# --scale: a mesh's close-up capture (rings of views at 4, 2.6 and 1.8 from its centre, 800 px; the glmark2 bunny by
# default) in a tree of many small nodes: 65,536 parameters a node, so the array grows with the tree, to depth 4
# (692 nodes on the bunny), each level trained by the rays whose footprint selects it and, through the level
# dither, by views up to two levels farther. One decoder serves every node: a deep node's own MLP would learn only
# from the few close-ups that reach it, and with one the quality grows with the number of nodes where with an MLP
# per node it fell. Half of each batch comes from the downscaled images (finest_share 0.5 against the trainer's
# 0.8): the coarse levels a deep tree draws at 2x and 4x the distance learn from those (docs/guides/scenes.md,
# "The scale preset").
SCALE = dict(FULL, views=300, test_views=6, res=800, camera_radii="4,2.6,2.6,1.8,1.8,1.8", max_depth=4, steps=5000,
             batch=65536, samples=256, pyramid_levels=4, lr=3e-2, node_budget=65536, footprint="surface",
             level_dither=2.0, decoder="shared", finest_share=0.5)
# --small --scale: the same structure at CPU size (tests).
SCALE_SMALL = dict(SMALL, views=24, test_views=2, res=32, camera_radii="4,2.6,1.8", max_depth=2, node_budget=16384,
                   footprint="surface", level_dither=2.0, min_leaf_resolution=0,
                   decoder="shared", finest_share=0.5)
SCALE_MESH = "/usr/share/glmark2/models/bunny.obj"  # Debian's glmark2-data
# The initial rate of a capture's octree at full size (its grids budgeted to the single-grid teacher's parameters,
# the rate decaying to 0.1x): 0.01 / 0.02 / 0.03 / 0.05 on the bunny, the duck and the Wuson mesh at 800 pixels,
# 0.03 best or within 0.1 dB on each (docs/design-notes.md, octree quality). The procedural scene's fixed small
# grids keep 0.01 (0.03 there: finest level -0.25 dB, 4x the distance +2.1 dB, one run each).
CAPTURE_LR = 3e-2
# Rays per step of a capture's octree at full size: with the visual hull a step evaluates about a tenth of its
# rays' samples, and 65,536 rays a step (8,192 before the hull) measured best of 8,192 / 32,768 / 65,536 on the
# three meshes at 800 pixels in the teacher's time (docs/guides/scenes.md).
CAPTURE_BATCH = 65536


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scene", default="procedural", choices=["procedural"], help="built-in scene (default)")
    p.add_argument("--data", default=None, help="a scene folder: NeRF-synthetic, instant-ngp or nerfstudio")
    p.add_argument("--mesh", default=None, help="an .obj or .ply mesh, rendered into --out/mesh_scene first")
    p.add_argument("--level-dither", type=float, default=None,
                   help="training rays' footprints shrunk by 2^-u, u in [0, this): deep nodes also learn from farther "
                        "views (OctreeTrainer's level_dither; 0: off, the default; --scale: 2)")
    p.add_argument("--footprint", default=None, choices=["box", "surface"],
                   help="the deepest nodes' footprint with a parameter budget: 'box', the closest view's farthest "
                        "in-box point (default); 'surface', where the closest view meets the visual hull (close-up "
                        "captures; --scale)")
    p.add_argument("--camera-radii", default=None,
                   help="with --mesh: the cameras' distances from the mesh centre, comma-separated (the views split "
                        "evenly; a radius listed twice gets twice the views; closer spheres give close-ups; default "
                        "4, --scale 4,2.6,2.6,1.8,1.8,1.8)")
    p.add_argument("--small", action="store_true", help="CPU-sized defaults (32 px, depth 3, 250 steps)")
    p.add_argument("--max-depth", type=int, default=None, help="octree depth limit (full: 4, small: 3)")
    p.add_argument("--min-points", type=int, default=None, help="a node splits while it holds more points")
    p.add_argument("--views", type=int, default=None, help="training views (full: 100, small: 24)")
    p.add_argument("--test-views", type=int, default=None, help="held-out views")
    p.add_argument("--res", type=int, default=None, help="image side in pixels (full: 128, small: 32)")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    p.add_argument("--pyramid-levels", type=int, default=None, help="image pyramid levels trained (1 = none)")
    p.add_argument("--samples", type=int, default=None, help="samples per ray")
    p.add_argument("--batch", type=int, default=None, help="rays per step")
    p.add_argument("--points", type=int, default=None, help="surface points the octree is built over")
    p.add_argument("--grid-levels", type=int, default=None,
                   help="grid levels per node (resolutions 2, 4, 8, ...; the finest sets the LoD rule)")
    p.add_argument("--grid-features", type=int, default=None, help="features per grid level (1, 2, 4, 8)")
    p.add_argument("--neurons", type=int, default=None, help="MLP width per node (16, 32, 64, 128)")
    p.add_argument("--log2-hashmap", type=int, default=None,
                   help="log2 of each grid level's table size (default: dense-sized, 3 x levels, at most 19)")
    p.add_argument("--base-resolution", type=int, default=None, help="coarsest grid resolution (default 2)")
    p.add_argument("--lod-resolution", type=float, default=None,
                   help="grid cells per node edge for the level-of-detail rule (default: the finest grid level's)")
    p.add_argument("--per-level-scale", type=float, default=None, help="grid resolution growth per level (2)")
    p.add_argument("--param-budget", default=None,
                   help="parameters of the whole node array: a number, 'teacher' (the single-grid teacher's table at "
                        "this resolution: the same parameter memory) or 'none' (the fixed grid options); sizes each "
                        "node's table and, with --leaf-resolution, its levels (default: 'teacher' for --data/--mesh)")
    p.add_argument("--node-budget", type=int, default=None,
                   help="parameters of each node instead of --param-budget's whole array: the array grows with the "
                        "tree (--scale: 65536)")
    p.add_argument("--leaf-resolution", default=None,
                   help="with --param-budget: the level rule's cells per node edge, a number or 'auto' (the deepest "
                        "nodes' cells as wide as the closest view's footprint; default)")
    p.add_argument("--decoder", choices=("shared", "per-node"), default=None,
                   help="shared: one MLP for every node, each node keeping its own grid, so every sample trains the "
                        "decoder (--scale's default); per-node: an MLP in every node (the default otherwise)")
    p.add_argument("--blend-margin", type=float, default=0.0,
                   help="band inside each node face (in node edges) where samples blend with the node across it, so "
                        "the field has no seams (0: none; 0.1: a tenth of the node's edge inside each face)")
    p.add_argument("--lr", type=float, default=None,
                   help="the node array's initial Adam learning rate (default 1e-2; a capture, --data or --mesh, at "
                        "full size 3e-2, decaying to 0.1x)")
    p.add_argument("--finest-share", type=float, default=None,
                   help="share of each batch from the full-resolution images, the only rays that train the deepest "
                        "nodes (default: the trainer's, 0.8; --scale: 0.5); the coarser pyramid levels split the rest")
    p.add_argument("--final-lr-factor", type=float, default=None,
                   help="the learning rate decays exponentially to lr times this over --steps (1: constant; full: "
                        "0.1, small: 1, as a few hundred steps are too few for a decay)")
    p.add_argument("--oversample", type=float, default=2.0,
                   help="with --param-budget: each node's finest grid level is this many times finer than the level "
                        "rule's cells (as a single grid's finest level is finer than a pixel)")
    p.add_argument("--min-leaf-resolution", type=float, default=None,
                   help="with --param-budget: the tree stops (below --max-depth) at the depth whose nodes would get "
                        "fewer level-rule cells than this from the capture (0: --max-depth alone; default 256)")
    p.add_argument("--table-dtype", default=None, choices=["float32", "bfloat16"],
                   help="grid table storage: float32, or bfloat16 (compact: 6 bytes per trained value with Adam, "
                        "against 20); default float32")
    p.add_argument("--scale", action="store_true",
                   help="scale preset: a mesh's close-up capture (300 views at 800 px; --mesh, default the glmark2 "
                        "bunny) and a tree of 65,536-parameter nodes to depth 4 (692 nodes on the bunny)")
    p.add_argument("--far-factor", type=float, default=4.0, help="far camera: distance times this")
    p.add_argument("--far-sweep", default="2,4,8,16,32",
                   help="comma list of distance factors whose share of touched parameters is reported")
    p.add_argument("--lod-factors", default="1,2,4,8",
                   help="level-of-detail curve: the held-out view pulled back by each factor, its render compared with "
                        "the area-filtered truth at that distance (procedural scene or --mesh; empty: none)")
    p.add_argument("--truth-mesh", default=None,
                   help="level-of-detail curve for a --data folder written by tinn.scenes.data.mesh: the mesh it "
                        "came from")
    p.add_argument("--lod-supersample", type=int, default=4,
                   help="level-of-detail curve: point samples per pixel side of the area-filtered truth")
    p.add_argument("--hull-res", type=int, default=None,
                   help="voxels per axis of the training views' visual hull, outside which no sample is evaluated in "
                        "training or rendering (0: none; full: 128, small: 32)")
    p.add_argument("--occupancy-res", type=int, default=None,
                   help="voxels per axis of the occupancy grid built after training for rendering (0: none)")
    p.add_argument("--alpha-threshold", type=float, default=0.01,
                   help="a voxel is occupied where one render step at its densest point reaches this alpha")
    p.add_argument("--render-segments", type=int, default=2,
                   help="early ray termination: runs of samples per ray (1: every sample in one run)")
    p.add_argument("--early-stop", type=float, default=1e-4,
                   help="early ray termination: transmittance below which a ray ends (0: never)")
    p.add_argument("--out", default="out/octree_lod", help="output folder (PNGs, summary.json)")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--seed", type=int, default=0)
    add_viewer_args(p)
    p.add_argument("--full", action="store_true", help="full-size defaults even without a GPU")
    p.add_argument("--shard", action="store_true",
                   help="under torchrun: the nodes' networks sharded over the ranks, each rank training on its "
                        "own rays (only rank 0 prints and writes --out; parameter counts are rank 0's share)")
    args = p.parse_args(argv)
    if args.shard and viewer_kind(args):
        p.error("--shard runs without the viewer")
    return args


def apply_defaults(args, on_gpu: bool):
    """Fill unset sizes: full size on a GPU (or with --full), CPU-sized otherwise (or with --small)."""
    small = args.small or not (on_gpu or args.full or args.scale)
    if args.scale:
        defaults = dict(SCALE_SMALL if args.small else SCALE)
        if not (args.mesh or args.data):
            if not os.path.exists(SCALE_MESH):
                raise SystemExit(f"--scale trains on a mesh's close-up capture: pass --mesh PATH (an .obj or .ply), "
                                 f"or install Debian's glmark2-data for its default, {SCALE_MESH}")
            args.mesh = SCALE_MESH
    else:
        defaults = dict(SMALL if small else FULL)
    defaults.setdefault("table_dtype", "float32")
    defaults.setdefault("camera_radii", "4")
    defaults.setdefault("footprint", "box")
    defaults.setdefault("level_dither", 0.0)
    defaults.setdefault("decoder", "per-node")
    if args.data and not (small or args.scale):
        defaults["res"] = 100  # NeRF-synthetic images are 800 px: 100 = 800 / 8
    if (args.data or args.mesh) and not (small or args.scale):
        defaults["lr"], defaults["batch"] = CAPTURE_LR, CAPTURE_BATCH
    for key, value in defaults.items():
        attr = {"n_points": "points"}.get(key, key)
        if getattr(args, attr, None) is None:
            setattr(args, attr, value)
    if args.pyramid_levels == defaults["pyramid_levels"]:
        # The default pyramid stops where the image side stops being divisible by 2^level.
        while args.pyramid_levels > 1 and args.res % 2 ** (args.pyramid_levels - 1):
            args.pyramid_levels -= 1
    return small


def load_scene(args):
    """(train images, held-out images, points to build the octree over; None for a capture, whose octree is
    built over its visual hull once its depth is known)."""
    if args.mesh:
        from tinn.scenes.data.mesh import parse_radii, scene_from_mesh

        args.data = scene_from_mesh(args.mesh, os.path.join(args.out, "mesh_scene"), args.views, args.test_views,
                                    args.res, radii=parse_radii(args.camera_radii))
    if args.data:
        from tinn.scenes.data.formats import load_scene as load_folder

        probe = load_folder(args.data, split="train", max_views=1)
        if probe.width % args.res:
            raise SystemExit(f"--res {args.res} must divide the images' width {probe.width}")
        down = probe.width // args.res
        train = load_folder(args.data, split="train", downscale=down, max_views=args.views)
        test = load_folder(args.data, split="test", downscale=down, max_views=args.test_views)
        return train, test, None
    from tinn.scenes.data.procedural import ProceduralScene, render_views, surface_points

    scene = ProceduralScene()
    train = render_views(scene, args.views, args.res, args.res, seed=args.seed)
    test = render_views(scene, args.test_views, args.res, args.res, seed=args.seed + 1000)
    return train, test, surface_points(scene, args.points, seed=args.seed)


def build_field(args, train, points):
    from tinn.scenes.acceleration.octree_budget import DEFAULT_MIN_LEAF_RESOLUTION, budgeted_octree
    from tinn.scenes.fields.octree_field import OctreeField
    from tinn.scenes.training.octree_training import octree_over

    dev = tinn.runtime.device()
    network = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
               "n_neurons": args.neurons, "n_hidden_layers": 1}
    budget = param_budget(args, train)
    if args.min_leaf_resolution is None:
        args.min_leaf_resolution = DEFAULT_MIN_LEAF_RESOLUTION
    hull = hull_of(args, train)
    if budget is not None:
        # No deeper than the capture feeds: nodes below would hold fewer cells than the pixels they are fit to.
        leaf = args.leaf_resolution or "auto"
        footprint = None
        if args.footprint == "surface":  # where the closest view meets the hull (captures with close-ups)
            from tinn.scenes.acceleration.octree_budget import surface_footprint
            from tinn.scenes.acceleration.visual_hull import visual_hull
            footprint = surface_footprint(train, hull if hull is not None else visual_hull(train))
        built = budgeted_octree(train, budget, network, max_depth=args.max_depth,
                                min_leaf_resolution=args.min_leaf_resolution, min_points=args.min_points,
                                oversample=args.oversample, points=None if points is None else points.to(dev),
                                lod_resolution=None if leaf == "auto" else float(leaf), footprint=footprint,
                                n_features=args.grid_features, table_dtype=args.table_dtype,
                                per_node=args.node_budget is not None)
        tree, encoding = built.tree, built.encoding
        args.max_depth = built.depth
        args.grid_levels, args.log2_hashmap = encoding["n_levels"], encoding["log2_hashmap_size"]
        args.lod_resolution = args.lod_resolution or built.lod_resolution
        # One pyramid level per octree level: coarser images would only train the root again.
        args.pyramid_levels = min(args.pyramid_levels, tree.deepest + 1)
        field = OctreeField(tree, encoding, network, lod_resolution=args.lod_resolution, seed=args.seed + 1,
                            blend_margin=args.blend_margin, hull=hull, shared_decoder=args.decoder == "shared")
        return _sharded(args, field, tree, encoding, network)
    tree = octree_over(train, args.max_depth, args.min_points, None if points is None else points.to(dev))
    encoding = {"otype": "HashGrid", "n_levels": args.grid_levels, "n_features_per_level": args.grid_features,
                # Tables big enough to stay dense by default: (2^levels)^3 entries at the finest level.
                "log2_hashmap_size": args.log2_hashmap or min(3 * args.grid_levels, 19),
                "base_resolution": args.base_resolution or 2, "per_level_scale": args.per_level_scale or 2.0,
                "table_dtype": args.table_dtype}
    field = OctreeField(tree, encoding, network, lod_resolution=args.lod_resolution, seed=args.seed + 1,
                        blend_margin=args.blend_margin, hull=hull, shared_decoder=args.decoder == "shared")
    return _sharded(args, field, tree, encoding, network)


def hull_of(args, train):
    """The training views' visual hull at --hull-res voxels per axis (None for 0): the field evaluates no sample
    outside it."""
    if not args.hull_res:
        return None
    from tinn.scenes.acceleration.visual_hull import visual_hull

    return visual_hull(train, resolution=args.hull_res)


def build_trainer(args, field, train):
    """The field's trainer: Adam (decaying to lr x final-lr-factor over --steps) on rays from the training
    views' image pyramid."""
    from tinn.scenes.training.octree_training import DEFAULT_OPTIMIZER, OctreeTrainer
    from tinn.scenes.training.photometric import decaying_adam

    adam = {k: v for k, v in DEFAULT_OPTIMIZER.items() if k not in ("otype", "learning_rate")}
    optimizer = decaying_adam(args.lr, args.steps if args.final_lr_factor != 1.0 else None, args.final_lr_factor,
                              **adam)
    share = {} if args.finest_share is None else {"finest_share": args.finest_share}
    return OctreeTrainer(field, train, pyramid_levels=args.pyramid_levels, n_samples=args.samples,
                         batch_rays=args.batch, seed=args.batch_seed, optimizer_config=optimizer,
                         level_dither=args.level_dither, **share)


def param_budget(args, train):
    """The node array's parameter budget from --param-budget (None: the fixed grid options)."""
    from tinn.scenes.acceleration.octree_budget import single_grid_params

    if args.node_budget is not None:
        if args.param_budget is not None:
            raise SystemExit("--node-budget and --param-budget exclude each other: one sizes each node, the other the "
                             "whole array")
        return args.node_budget
    value = args.param_budget or ("teacher" if args.data and not (args.scale or args.small) else "none")
    if value == "none":
        return None
    if value == "teacher":
        # The KiloNeRF demo's full-size teacher: 16 levels of 2^19 entries, 2 features, resolutions 16 .. 4 x res.
        return single_grid_params(max(4 * train.width, 16))
    try:
        return int(float(value))
    except ValueError:
        raise SystemExit(f"--param-budget {value!r}: allowed: a number of parameters, 'teacher' or 'none'")


def _sharded(args, field, tree, encoding, network):
    """With --shard, the field's node array spread over the ranks."""
    if args.shard:
        import tinn.distributed as td
        from tinn.models import NetworkWithInputEncoding

        field.model = td.ShardedPart(lambda n: NetworkWithInputEncoding(3, 4, encoding, network, n_networks=n,
                                                                        seed=args.seed + 1, group_by_network=False,
                                                                        share_network=args.decoder == "shared"),
                                     tree.n_nodes,
                                     config={"encoding": encoding, "network": network})
    return field


def lod_truth(args, test):
    """The scene's area-filtered truth from any camera (`tinn.scenes.training.lod_eval`): the procedural scene or the
    --mesh; None for a scene folder (its images are all there is)."""
    from tinn.scenes.training import lod_eval

    if args.mesh or args.truth_mesh:
        from tinn.scenes.data.mesh import read_mesh

        return lod_eval.mesh_truth(read_mesh(args.truth_mesh or args.mesh), test.background.float(),
                                   supersample=args.lod_supersample)
    if args.data:
        return None
    from tinn.scenes.data.procedural import ProceduralScene

    return lod_eval.procedural_truth(ProceduralScene(), test.background.float(), supersample=args.lod_supersample)


def far_view(images, view: int, factor: float):
    """The same camera pulled back from the origin by `factor` (it keeps looking at the scene centre)."""
    c2w = images.c2w[view].clone()
    c2w[:3, 3] *= factor
    return c2w


class OctreeSource(TrainerControls):
    """Viewer source: trains the octree field, shows a held-out view, which node each pixel meets first and
    each node's error on that view."""

    # The held-out view's per-node error is rendered anew at most this often (the viewer asks every step and
    # averages; a render per step would cost more than the step, and the page shows the map twice a second).
    NODE_LOSS_PERIOD_S = 1.0

    lod_range = (-3.0, 3.0)  # the viewer's level-of-detail control: octree levels finer (+) or coarser (-)

    def __init__(self, trainer, test, samples: int, view: int = 0):
        self.trainer, self.field, self.test, self.samples, self.view = trainer, trainer.field, test, samples, view
        self.level_of_detail = 0.0
        frame = self._frame()
        self._ownership = frame["first_node"].clamp(min=0)  # pixels meeting no node show as the root
        self._steps = 0
        self._node_loss = None
        self._node_loss_at = None

    def _frame(self, c2w=None, width=None, height=None, focal=None):
        import torch

        t = self.test
        c2w = t.c2w[self.view] if c2w is None else torch.as_tensor(c2w, dtype=torch.float32, device=t.c2w.device)
        # The bias applies to renders only: a node's level goes up by one where the rule's root size doubles.
        trained_rule = self.field.lod_resolution
        self.field.lod_resolution = trained_rule * 2.0 ** -self.level_of_detail
        try:
            return self.field.render_image(c2w, width or t.width, height or t.height, focal or t.focal, self.samples,
                                           background=t.background.float())
        finally:
            self.field.lod_resolution = trained_rule

    def train_step(self):
        self._steps += 1
        return self.trainer.step()

    def per_network_loss(self):
        """Each node's mean squared error over the held-out view's pixels whose ray meets it first (0 for nodes
        no pixel meets first), refreshed at most every NODE_LOSS_PERIOD_S seconds."""
        import time

        import torch

        if self._node_loss is None or time.perf_counter() - self._node_loss_at >= self.NODE_LOSS_PERIOD_S:
            frame = self._frame()
            error = (frame["image"] - self.reference()).square().mean(dim=-1).reshape(-1)
            first = frame["first_node"].reshape(-1).long()
            met = first >= 0
            n = self.field.n_nodes
            total = torch.zeros(n, device=error.device).index_add_(0, first[met], error[met])
            count = torch.zeros(n, device=error.device).index_add_(0, first[met], torch.ones_like(error[met]))
            self._node_loss = total / count.clamp(min=1)
            self._node_loss_at = time.perf_counter()
        return self._node_loss

    def render(self):
        return self._frame()["image"]

    def reference(self):
        return self.test.images[self.view]

    def ownership(self):
        return self._ownership

    def render_from(self, c2w):
        """The viewer's orbit camera: the field from any pose (the level of detail follows the distance)."""
        return self._frame(c2w)["image"]

    def render_camera(self, c2w, width, height, focal):
        """The field from any pose at any size (the web viewer's cameras)."""
        return self._frame(c2w, width, height, focal)["image"]

    def orbit_start(self):
        """The orbit starts at the held-out view render() shows and turns around the scene box's centre."""
        return self.test.c2w[self.view], (self.test.box_min + self.test.box_max) / 2



def _save(path, image):
    from tinn.tasks.image import save_png

    save_png(path, image)


def _ownership_png(path, first_node, n_nodes):
    """Each pixel coloured by the node its ray meets first (black: none)."""
    import numpy as np
    import torch

    from tinn.viewer.render import network_colors

    ids = first_node.cpu().numpy().astype(np.int64)
    img = np.where((ids >= 0)[..., None], network_colors(n_nodes)[np.clip(ids, 0, None)], 0.0)
    _save(path, torch.from_numpy(img.astype(np.float32)))



def run(argv=None) -> dict:
    args = parse_args(argv)
    arch = start_script(args)  # tinn, and with --shard the process group
    small = apply_defaults(args, arch == "cuda")
    if small and not args.small:
        print("no GPU: CPU-sized run (--full for the full size)")
    import torch

    from tinn import chunks
    from tinn.render import seconds_per_frame
    from tinn.scenes.training.octree_training import evaluate

    dev = tinn.runtime.device()
    on_gpu = arch == "cuda"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    train, test, points = load_scene(args)
    train, test = train.to(dev), test.to(dev)
    field = build_field(args, train, points)
    tree = field.octree
    trainer = build_trainer(args, field, train)
    print(f"tinn {tinn.__version__} on {arch}: octree depth {tree.deepest} (limit {args.max_depth}), "
          f"{tree.n_nodes} nodes/networks {tree.nodes_per_level()} per level, {field.params_per_node()} params "
          f"per node; {len(train)} views {train.width}x{train.height}, {args.pyramid_levels} pyramid levels")
    grid = getattr(field.model, "local", field.model).encoding  # a sharded model: this rank's nodes
    table = grid.n_networks * grid.n_params_per_network()
    launches = len(chunks.row_spans(grid.n_networks, grid.n_params_per_network()))
    print(f"grid table: {grid.n_levels} levels x 2^{grid.log2_hashmap_size} entries per node, {table} floats "
          f"({table * 4 / 2**30:.2f} GiB; {'past' if table > 2**31 - 1 else 'below'} 2^31, {launches} launch(es) "
          "per kernel)")

    os.makedirs(args.out, exist_ok=True)
    if viewer_kind(args):
        viewer = open_viewer(args, OctreeSource(trainer, test, args.samples), args.out, "tinn octree LoD")
        summary = viewer.run(args.steps)
        psnr = summary["final_psnr"]
        print(f"viewer ({summary['backend']}): {summary['steps']} steps, PSNR "
              + ("-" if psnr is None else f"{psnr:.2f} dB"))
        return summary

    bar = ProgressBar(args.steps)
    t0 = time.perf_counter()
    loss = None
    for step in range(1, args.steps + 1):
        loss = trainer.step()
        if step % max(args.steps // 20, 1) == 0 or step == args.steps:
            bar.update(step, loss=float(loss))
    tinn.runtime.sync()
    train_seconds = time.perf_counter() - t0
    bar.close()

    # Rendering: empty-space skipping with an occupancy grid over the trained field, early ray termination.
    render = {"segments": args.render_segments, "early_stop": args.early_stop}
    occupancy_seconds = 0.0
    if args.occupancy_res > 0:
        t1 = time.perf_counter()
        field.occupancy = field.build_occupancy(args.occupancy_res, args.samples, args.alpha_threshold)
        tinn.runtime.sync()
        occupancy_seconds = time.perf_counter() - t1
    full = evaluate(field, test, args.samples, **render)
    coarse_factor = 2 ** min(2, args.pyramid_levels - 1)
    coarse = evaluate(field, test.downscaled(coarse_factor), args.samples, **render) if coarse_factor > 1 else full
    every = evaluate(field, test, args.samples, occupancy=None, segments=1)  # every sample: what skipping costs
    background_psnr = -10 * torch.log10(((test.images - test.background.float()) ** 2).mean()).item()
    repeats = 10 if on_gpu else 2
    frame = {name: seconds_per_frame(lambda kw=kw: field.render_image(
        test.c2w[0], test.width, test.height, test.focal, args.samples, background=test.background.float(), **kw),
        repeats) for name, kw in (("skipping", render), ("skipping_one_run", {"segments": 1}),
                                  ("every_sample", {"occupancy": None, "segments": 1}))}

    # Near vs far: the same held-out camera, pulled back; a far camera's samples select coarser nodes.
    near = field.render_image(test.c2w[0], test.width, test.height, test.focal, args.samples,
                              background=test.background.float(), **render)
    far = field.render_image(far_view(test, 0, args.far_factor), test.width, test.height, test.focal, args.samples,
                             background=test.background.float(), **render)
    near_report, far_report = field.touched_report(near["touched"]), field.touched_report(far["touched"])
    # The share of the parameters a frame touches against the camera's distance (the LoD picks coarser nodes
    # once a pixel's footprint passes the deepest nodes' grid spacing).
    far_sweep = {}
    for factor in (float(v) for v in args.far_sweep.split(",") if v.strip()):
        if factor == args.far_factor:  # rendered above
            far_sweep[f"{factor:g}"] = far_report["fraction_touched"]
            continue
        frame_out = field.render_image(far_view(test, 0, factor), test.width, test.height, test.focal, args.samples,
                                       background=test.background.float(), **render)
        far_sweep[f"{factor:g}"] = field.touched_report(frame_out["touched"])["fraction_touched"]

    # Every level against what a viewer at its distance should see: the truth area-filtered at that distance.
    curve = []
    truth = lod_truth(args, test)
    factors = [float(v) for v in args.lod_factors.split(",") if v.strip()]
    if truth is not None and factors:
        from tinn.scenes.training.lod_eval import lod_curve

        curve = lod_curve(field, truth, test.c2w, test.width, test.height, test.focal, args.samples, factors,
                          background=test.background.float(), **render)

    _save(os.path.join(args.out, "test_prediction.png"), full["renders"][0])
    _save(os.path.join(args.out, "test_reference.png"), test.images[0])
    if coarse is not full:
        _save(os.path.join(args.out, f"test_prediction_x{coarse_factor}.png"), coarse["renders"][0])
    _save(os.path.join(args.out, "far_prediction.png"), far["image"])
    _ownership_png(os.path.join(args.out, "near_first_node.png"), near["first_node"], tree.n_nodes)
    _ownership_png(os.path.join(args.out, "far_first_node.png"), far["first_node"], tree.n_nodes)

    summary = {
        "arch": arch, "steps": args.steps, "views": len(train), "resolution": [train.width, train.height],
        "pyramid_levels": args.pyramid_levels, "nodes": tree.n_nodes, "nodes_per_level": tree.nodes_per_level(),
        "params_per_node": field.params_per_node(), "params_total": field.n_params(), "decoder": args.decoder,
        "finest_share": args.finest_share,
        "param_bytes": field.memory_bytes(), "grid_table_floats": table, "grid_table_launches": launches,
        "table_dtype": args.table_dtype,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if on_gpu else None,
        "train_seconds": train_seconds, "steps_per_second": args.steps / train_seconds,
        "final_loss": float(loss) if loss is not None else None,
        "psnr": full["psnr"], "psnr_by_distance": full["psnr_by_distance"],
        f"psnr_x{coarse_factor}": coarse["psnr"], "coarse_factor": coarse_factor,
        "background_psnr": background_psnr,
        "psnr_every_sample": every["psnr"],
        "occupied_fraction": field.occupancy.occupied_fraction() if field.occupancy is not None else None,
        "hull_res": args.hull_res,
        "hull_fraction": float(field.hull.occupied.float().mean()) if field.hull is not None else None,
        "occupancy_seconds": occupancy_seconds,
        "render_seconds": frame["skipping"], "fps": 1.0 / frame["skipping"],
        "render_seconds_every_sample": frame["every_sample"], "fps_every_sample": 1.0 / frame["every_sample"],
        "render_seconds_one_run": frame["skipping_one_run"],
        # The timed frame's samples (the near frame is that view, drawn alike): a frame's time follows them.
        "samples_per_frame": int(near["n_evaluated"]),
        "render": render,
        "fraction_touched_mean": full["fraction_touched"],
        "near": near_report, "far": far_report, "far_factor": args.far_factor, "far_sweep": far_sweep,
        "lod_curve": curve,
        "held_out_frames": [{"view": v, "nodes_touched": r["nodes_touched"], "fraction_touched": r["fraction_touched"]}
                            for v, r in enumerate(full["reports"])],
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    mem = f"{summary['param_bytes'] / 2**20:.1f} MiB params"
    if on_gpu:
        mem += f", peak GPU {summary['peak_gpu_bytes'] / 2**20:.0f} MiB"
    print(f"held-out PSNR {full['psnr']:.2f} dB (x{coarse_factor} coarser: {coarse['psnr']:.2f} dB; every sample "
          f"evaluated: {every['psnr']:.2f} dB; background only: {background_psnr:.2f} dB)")
    if full["psnr_by_distance"]:  # a capture with close-ups: each sphere's held-out views on their own
        print("held-out PSNR by camera distance: " + ", ".join(f"{d}: {p:.2f} dB"
                                                               for d, p in full["psnr_by_distance"].items()))
    occupied = "" if field.occupancy is None else \
        (f"occupancy {args.occupancy_res}^3 per depth, occupied "
         f"{'/'.join(f'{100 * f:.0f}' for f in summary['occupied_fraction'])}% ({occupancy_seconds:.2f} s); ")
    hull = "" if field.hull is None else \
        f"visual hull {args.hull_res}^3, {100 * summary['hull_fraction']:.1f}% of the box; "
    print(f"training {train_seconds:.1f} s ({summary['steps_per_second']:.1f} steps/s); {hull}{occupied}{mem}")
    print(f"render {test.width}x{test.height}, {args.samples} samples/ray: {frame['skipping'] * 1e3:.1f} ms/frame "
          f"({summary['fps']:.1f} fps, {summary['samples_per_frame'] / 1e6:.1f} M samples) with skipping and early "
          f"termination ({args.render_segments} runs); skipping in "
          f"one run {frame['skipping_one_run'] * 1e3:.1f} ms; every sample "
          f"{frame['every_sample'] * 1e3:.1f} ms ({summary['fps_every_sample']:.1f} fps)")
    for name, rep in (("near", near_report), (f"far x{args.far_factor:g}", far_report)):
        print(f"{name} camera: {rep['nodes_touched']}/{rep['nodes_total']} nodes, "
              f"{rep['params_touched']}/{rep['params_total']} params, {rep['param_bytes_touched']} bytes "
              f"({100 * rep['fraction_touched']:.1f}%) touched; per depth {rep['nodes_touched_per_depth']}")
    if far_sweep:
        print("parameters touched by a camera pulled back by " +
              ", ".join(f"x{k}: {100 * v:.1f}%" for k, v in far_sweep.items()))
    if curve:
        from tinn.scenes.training.lod_eval import format_curve

        print(f"level of detail, the held-out views pulled back (truth area-filtered {args.lod_supersample}^2 per "
              "pixel, PSNR on the object's window, pooled over the views):")
        print(format_curve(curve))
    print(f"PNGs and summary.json in {args.out}")
    return summary


if __name__ == "__main__":
    run()
    if "--shard" in sys.argv:
        import tinn.distributed as td

        td.shutdown()

"""The octree LoD scene against the single-grid teacher and the KiloNeRF student, mesh by mesh.

For each mesh: render its views (train and held out) at --res; run the KiloNeRF pipeline of `demos/kilonerf.py`
(teacher, occupancy, distillation, fine-tuning; its options apply) and take the teacher's and the student's
held-out PSNR and times; then train an octree field with the teacher's parameter count as its budget
(`tinn.scenes.acceleration.octree_budget`: the tree as deep as the capture feeds, each node's grid as fine as
the closest view's footprint asks) for the teacher's training time times --time-factor, and report its held-out PSNR
(full resolution: the finest level), its frame time, and its level-of-detail curve: the held-out view
pulled back by each --lod-factors entry, rendered by the coarser nodes the rule picks and compared with the
mesh area-filtered at that distance (`tinn.scenes.training.lod_eval`). Prints a table and writes JSON.

    python -m benchmarks.tools.octree_quality --res 64 --views 40 --teacher-steps 200 --distill-steps 100 \
        --finetune-steps 100 --samples 64 --octree-batch 1024          # CPU-sized
    python -m benchmarks.tools.octree_quality --res 800 --views 100 --samples 256 --teacher-steps 3000 \
        --batch-rays 8192 --distill-steps 2000 --finetune-steps 2000 --frequencies 6 --out out/octree_quality

Octree variants after one teacher: --max-depth 4,3, --blend-margin 0,0.1, --octree-final-lr 1,0.1,
--finest-share 0.53,0.8, --grid-base 2,8, --level-scale 2,1.5, --octree-samples, --oversample, --neurons,
--octree-hidden and --fill-levels take comma lists
(one octree per combination, each trained for the teacher's time).

Meshes: --meshes takes comma-separated paths or the names bunny, duck, wuson (Debian glmark2-data and
assimp-testmodels).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch

import tinn
from tinn.tasks.image import psnr_from_mse, save_png
from benchmarks.loading import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

MESHES = {"bunny": "/usr/share/glmark2/models/bunny.obj",
          "duck": "/usr/share/assimp/models/Collada/duck.dae",
          "wuson": "/usr/share/assimp/models/OBJ/WusonOBJ.obj"}


def parse_args(argv=None):
    demo = load_file("demos/kilonerf.py")

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                add_help=False)
    p.add_argument("--meshes", default="bunny,duck,wuson")
    p.add_argument("--time-factor", default="1",
                   help="the octree trains for the teacher's time times this (comma list: one octree per value)")
    p.add_argument("--budget-factor", default="1",
                   help="the octree's parameter budget is the teacher's parameter count times this (comma list: one "
                        "octree per value; above 1 it measures what more capacity would buy)")
    p.add_argument("--octree-steps", type=int, default=None,
                   help="train every octree for this many steps instead of the teacher's time (a shared machine's "
                        "load makes equal times unequal work)")
    p.add_argument("--octree-seconds", type=float, default=None,
                   help="train no teacher or KiloNeRF: each octree trains this many seconds (x --time-factor) within "
                        "the teacher's parameter budget for this capture (or --node-budget); for what deeper trees buy "
                        "at a capture too large to train the baselines on as well")
    p.add_argument("--reuse-baselines", default=None,
                   help="an earlier run's JSON: take the teacher and KiloNeRF results (and the teacher's parameter "
                        "budget and time) from it instead of training them again")
    p.add_argument("--octree-lr", default="0.03", help="the octree's initial learning rate (comma list: one octree "
                   "per value)")
    p.add_argument("--octree-final-lr", default="0.1",
                   help="the learning rate decays exponentially to lr times this over the training time (1: constant; "
                        "0.1 as the demo's full size); a comma list trains one octree per value")
    p.add_argument("--octree-batch", default="65536",
                   help="rays per octree step ('default': --batch-rays; comma list); with the hull a step evaluates "
                        "about a tenth of its rays' samples, so it takes more rays than the teacher's")
    p.add_argument("--max-depth", default="4", help="octree depth limit; a comma list trains one octree per value")
    p.add_argument("--min-leaf-resolution", type=float, default=None,
                   help="the tree stops at the depth whose nodes span fewer footprints of the closest view (default: "
                        "tinn.scenes.acceleration.octree_budget.DEFAULT_MIN_LEAF_RESOLUTION, 256)")
    p.add_argument("--oversample", default="2", help="node grids go this much finer than the level rule's cells "
                   "(comma list: one octree per value)")
    p.add_argument("--finest-share", default="default",
                   help="share of each octree batch from the full-resolution images (the finest nodes); 'default': "
                        "the trainer's; 0: shares halving per pyramid level (8/15 with 4 levels); a comma list "
                        "trains one octree per value")
    p.add_argument("--grid-base", default="default", help="node grids' coarsest resolution ('default': the budget "
                   "rule's; comma list)")
    p.add_argument("--level-scale", default="default", help="node grids' largest growth per level ('default': the "
                   "budget rule's; comma list)")
    p.add_argument("--octree-samples", default="default", help="samples per ray of the octree trainer ('default': "
                   "--samples; comma list)")
    p.add_argument("--batches-per-draw", default="default", help="steps whose batches the octree trainer draws at "
                   "once ('default': the trainer's; 1: each the step before its own; comma list)")
    p.add_argument("--shared-decoder", default="0",
                   help="1: one MLP for every node, each keeping its own grid (OctreeField's shared_decoder); comma "
                        "list: one octree per value")
    p.add_argument("--blend-margin", default="0",
                   help="blend across node faces (0: off); a comma list trains one octree per value")
    p.add_argument("--neurons", dest="octree_neurons", default="32", help="each node's MLP width (comma list)")
    p.add_argument("--octree-hidden", default="1", help="each node's MLP hidden layers (comma list)")
    p.add_argument("--octree-segments", type=int, default=2,
                   help="early-termination runs of an octree frame (demos/octree_lod.py's default: 2; one run "
                        "evaluates every occupied sample behind the surface too)")
    p.add_argument("--hull", default="1", help="1: no sample outside the training views' visual hull is evaluated "
                   "(`OctreeField.hull`); 0: every sample in a node is (comma list)")
    p.add_argument("--hull-resolution", type=int, default=None,
                   help="voxels per box edge of that hull (default: tinn.scenes.acceleration.visual_hull's)")
    p.add_argument("--fill-levels", default="1", help="1: the budget rule spends what the table leaves on more "
                   "grid levels; 0: it does not (comma list)")
    p.add_argument("--pyramid-levels", type=int, default=4)
    p.add_argument("--lod-factors", default="1,2,4,8")
    p.add_argument("--lod-supersample", type=int, default=4)
    p.add_argument("--lod-rays", default="",
                   help="extra level-of-detail rows drawn with k x k rays a pixel: factor:k pairs, comma-separated "
                        "(e.g. 2:2)")
    p.add_argument("--level-dither", default="0",
                   help="OctreeTrainer's level_dither: training rays' footprints shrunk by 2^-u, u in [0, this), so "
                        "deep nodes also learn from farther views (comma list: one octree per value)")
    p.add_argument("--footprint", default="box", choices=["box", "surface"],
                   help="the deepest nodes' footprint: 'box', the closest view's farthest in-box point "
                        "(closest_footprint); 'surface', where the closest view sees the visual hull "
                        "(surface_footprint: for captures with close-ups, --camera-radii)")
    p.add_argument("--node-budget", type=int, default=None,
                   help="parameters per node instead of the teacher's budget for the whole array: the array grows "
                        "with the tree (what more nodes buy, e.g. over --max-depth 1,2,3,4)")
    p.add_argument("--occupancy-ab", action="store_true",
                   help="also evaluate the held-out views without the occupancy grids (what skipping costs)")
    p.add_argument("--lod-views", type=int, default=0,
                   help="held-out views each level-of-detail row pools (0: all of them)")
    p.add_argument("--lod-images", action="store_true",
                   help="write each level-of-detail row's first view (prediction, truth, error) as PNGs under --out, "
                        "and split each row's squared error between the silhouette band and the rest")
    p.add_argument("--json", default=None, help="JSON path (default: --out/octree_quality.json)")
    ours, rest = p.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:
        p.print_help()  # this tool's options; the KiloNeRF demo's follow
        print()
    args = demo.parse_args(rest)
    for k, v in vars(ours).items():
        setattr(args, k, v)
    return args


def octree_for(args, train, budget: int):
    """The budgeted octree field over the training views' visual hull (`budgeted_octree`, as the demo builds)."""
    from tinn.scenes.acceleration.octree_budget import (DEFAULT_MIN_LEAF_RESOLUTION, budgeted_octree,
                                                        surface_footprint)
    from tinn.scenes.fields.octree_field import OctreeField

    network = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
               "n_neurons": args.octree_neurons, "n_hidden_layers": args.octree_hidden}
    options = {"fill_levels": bool(args.fill_levels)}
    if args.grid_base is not None:
        options["base_resolution"] = int(args.grid_base)
    if args.level_scale is not None:
        options["max_level_scale"] = args.level_scale
    minimum = DEFAULT_MIN_LEAF_RESOLUTION if args.min_leaf_resolution is None else args.min_leaf_resolution
    hull = None
    if args.hull or args.footprint == "surface":
        from tinn.scenes.acceleration.visual_hull import DEFAULT_HULL_RESOLUTION, visual_hull
        hull = visual_hull(train, args.hull_resolution or DEFAULT_HULL_RESOLUTION)
    footprint = surface_footprint(train, hull) if args.footprint == "surface" else None
    per_node = args.node_budget is not None
    built = budgeted_octree(train, args.node_budget if per_node else budget, network, max_depth=args.max_depth,
                            min_leaf_resolution=minimum, oversample=args.oversample, footprint=footprint,
                            per_node=per_node, **options)
    if not args.hull:
        hull = None
    return OctreeField(built.tree, built.encoding, network, lod_resolution=built.lod_resolution, seed=args.seed + 3,
                       blend_margin=args.blend_margin, hull=hull, shared_decoder=bool(args.shared_decoder))


def single_grid_budget(args, train) -> int:
    """The grid parameters of the KiloNeRF demo's teacher for this capture (its table alone): the budget an octree
    gets without a teacher trained beside it."""
    from tinn.scenes.acceleration.octree_budget import single_grid_params

    return single_grid_params(max(4 * train.width, args.teacher_base), args.teacher_levels, args.teacher_log2_hashmap,
                              args.teacher_base)


def octree_trainer(args, field, train, total_steps: int | None):
    """The variant's `OctreeTrainer`: one pyramid level per octree level, the rate decaying over `total_steps`
    (None: constant)."""
    from tinn.scenes.training.octree_training import OctreeTrainer
    from tinn.scenes.training.photometric import decaying_adam

    levels = min(args.pyramid_levels, field.octree.deepest + 1)  # one pyramid level per octree level
    while levels > 1 and train.width % 2 ** (levels - 1):
        levels -= 1
    options = {} if args.finest_share is None else {"finest_share": args.finest_share or None}
    return OctreeTrainer(field, train, pyramid_levels=levels, n_samples=args.octree_samples or args.samples,
                         batch_rays=args.octree_batch or args.batch_rays,
                         optimizer_config=decaying_adam(args.octree_lr, total_steps, args.octree_final_lr,
                                                        l2_reg=1e-6),
                         seed=args.seed, batches_per_draw=args.batches_per_draw, level_dither=args.level_dither,
                         **options)


def train_octree(args, field, train, seconds: float):
    """Train for `seconds` (or --octree-steps steps, the rate decaying over them)."""
    def trainer(total):
        return octree_trainer(args, field, train, total)

    probe_steps = 0 if args.octree_steps else 8
    if args.octree_steps:
        steps, per_step = args.octree_steps, 0.0
    else:
        probe = trainer(None)
        for _ in range(3):  # warm-up: compiles
            probe.step()
        tinn.runtime.sync()
        t0 = time.perf_counter()
        for _ in range(5):
            probe.step()
        tinn.runtime.sync()
        per_step = (time.perf_counter() - t0) / 5
    if args.octree_steps:
        main = trainer(steps)
        tinn.runtime.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            main.step()
    else:
        # Train until the time is spent (steps get cheaper as the occupancy grids empty space, so a count from
        # the first steps' time left a third of the teacher's time unused); a decaying rate follows the time
        # spent: lr * final^(elapsed / budget), set every 25 steps.
        main = trainer(None)
        tinn.runtime.sync()
        t0 = time.perf_counter()
        steps = 0
        budget = seconds - probe_steps * per_step
        while (elapsed := time.perf_counter() - t0) < budget:
            if args.octree_final_lr != 1.0:
                main.learning_rate = args.octree_lr * args.octree_final_lr ** (elapsed / budget)
            for _ in range(25):
                main.step()
            steps += 25
            tinn.runtime.sync()
    tinn.runtime.sync()
    return {"steps": steps + probe_steps, "seconds": time.perf_counter() - t0 + probe_steps * per_step,
            "pyramid_levels": main.rays.n_levels, "batch_rays": main.batch_rays}


def run_mesh(args, name: str, path: str) -> dict:
    demo = load_file("demos/kilonerf.py")

    run_args = argparse.Namespace(**vars(args))
    run_args.mesh, run_args.data = path, None
    run_args.out = os.path.join(args.out, name)
    os.makedirs(run_args.out, exist_ok=True)
    t0 = time.perf_counter()
    train, test = demo.load_data(run_args)
    print(f"[{name}] {len(train)} views at {train.width}x{train.height} ({time.perf_counter() - t0:.1f} s)")
    reused = _reused_baselines(args, name, train)
    if args.octree_seconds is not None:
        teacher = {"psnr": None, "seconds": args.octree_seconds, "params": single_grid_budget(args, train),
                   "param_bytes": None, "frame_ms": None}
        kilonerf = None
        print(f"[{name}] no baselines: each octree trains {args.octree_seconds:g} s x its time factor")
    elif reused is None:
        pipe = demo.KiloNeRFPipeline(run_args, train, test)
        while pipe.phase != "done":
            print(f"[{name}] {pipe.run_phase()} done")
        kilo = demo.report(pipe, run_args.out, timing_repeats=5 if tinn.runtime.arch() == "cuda" else 1)
        teacher_params = sum(p.numel() for p in pipe.teacher.parameters())
        del pipe
        teacher = {"psnr": kilo["psnr_teacher"], "seconds": kilo["time_s"]["teacher"], "params": teacher_params,
                   "param_bytes": kilo["param_bytes_teacher"],
                   "frame_ms": kilo["render_ms_per_frame"]["teacher_skipping"]}
        kilonerf = {"psnr": kilo["psnr_student"],
                    "seconds": sum(kilo["time_s"][k] for k in ("teacher", "occupancy", "distill", "finetune")),
                    "param_bytes": kilo["param_bytes_student"], "frame_ms": kilo["render_ms_per_frame"]["student"]}
    else:
        teacher, kilonerf = reused
        print(f"[{name}] teacher and KiloNeRF from {args.reuse_baselines}: teacher {teacher['psnr']:.2f} dB")
    teacher_params, teacher_s = teacher["params"], teacher["seconds"]

    octrees = [run_octree(variant, name, path, train, test, teacher_params, teacher_s) for variant in variants(args)]
    return {"mesh": path, "res": train.width, "views": len(train), "test_views": len(test),
            "teacher": teacher, "kilonerf": kilonerf, "octree": octrees}


def _reused_baselines(args, name: str, train):
    """(teacher, kilonerf) records of this mesh from --reuse-baselines (an earlier run's JSON at the same
    resolution and views), or None when not asked for."""
    if not args.reuse_baselines:
        return None
    if args.octree_seconds is not None:
        raise SystemExit("--reuse-baselines and --octree-seconds exclude each other: the first takes the teacher's "
                         "time and budget from an earlier run, the second trains without one")
    with open(args.reuse_baselines) as f:
        earlier = json.load(f)["results"]
    if name not in earlier:
        raise SystemExit(f"--reuse-baselines {args.reuse_baselines}: no result for {name!r} (has {sorted(earlier)})")
    record = earlier[name]
    if (record["res"], record["views"]) != (train.width, len(train)):
        raise SystemExit(f"--reuse-baselines {args.reuse_baselines}: {name} was run at {record['res']} px with "
                         f"{record['views']} views, this run has {train.width} px and {len(train)} views")
    return record["teacher"], record["kilonerf"]


VARIANT_KEYS = ("octree_lr", "max_depth", "blend_margin", "octree_final_lr", "finest_share", "grid_base", "level_scale",
                "octree_samples", "oversample", "octree_neurons", "octree_hidden", "fill_levels", "time_factor",
                "budget_factor", "octree_batch", "batches_per_draw", "hull", "level_dither", "shared_decoder")


def variants(args):
    """One copy of `args` per combination of the variant lists (VARIANT_KEYS), each list's value in place and
    the integer options as ints."""
    lists = {key: _values(getattr(args, key)) for key in VARIANT_KEYS}
    for combination in itertools.product(*lists.values()):
        variant = argparse.Namespace(**vars(args))
        for key, value in zip(lists, combination):
            setattr(variant, key, value)
        for key in ("max_depth", "octree_neurons", "octree_hidden", "fill_levels", "hull"):
            setattr(variant, key, int(getattr(variant, key)))
        for key in ("octree_samples", "octree_batch", "batches_per_draw"):
            if getattr(variant, key) is not None:
                setattr(variant, key, int(getattr(variant, key)))
        yield variant


def _floats(text) -> list[float]:
    return [float(v) for v in str(text).split(",") if v.strip()]


def _values(text) -> list:
    """A comma list of numbers; 'default' stands for None (the library's own default)."""
    return [None if v.strip() == "default" else float(v) for v in str(text).split(",") if v.strip()]


def run_octree(args, name, path, train, test, teacher_params: int, teacher_s: float) -> dict:
    """One octree variant: built within the teacher's parameters, trained for the teacher's time (x time-factor),
    evaluated at full resolution and along the level-of-detail curve."""
    from tinn.scenes.training.lod_eval import format_curve, lod_curve, mesh_truth
    from tinn.scenes.data.mesh import read_mesh
    from tinn.scenes.training.octree_training import evaluate, views_by_distance
    from tinn.render import seconds_per_frame

    field = octree_for(args, train, int(teacher_params * args.budget_factor))
    octree_params = field.n_params()
    enc = field.encoding_config
    finest = enc["base_resolution"] * enc["per_level_scale"] ** (enc["n_levels"] - 1)
    print(f"[{name}] octree ({_variant_label(args)}): {field.n_nodes} "
          f"nodes {field.octree.nodes_per_level()}, grid {enc['n_levels']} levels x 2^{enc['log2_hashmap_size']} up to "
          f"{finest:.0f} cells per node edge, {octree_params} params (teacher {teacher_params})")
    timing = train_octree(args, field, train, teacher_s * args.time_factor)
    t1 = time.perf_counter()
    field.occupancy = field.build_occupancy(args.occupancy_res, args.samples, args.alpha_threshold)
    occupancy_s = time.perf_counter() - t1
    render = {"segments": args.octree_segments, "early_stop": args.early_stop}
    near = evaluate(field, test, args.samples, **render)
    groups, by_distance = views_by_distance(test), near["psnr_by_distance"]
    if by_distance:  # a capture with close-ups: each sphere's held-out views on their own
        print(f"[{name}] held-out PSNR by camera distance: " +
              ", ".join(f"{d}: {p:.2f} dB" for d, p in by_distance.items()))
    if args.occupancy_ab:
        kept, field.occupancy = field.occupancy, None
        try:
            plain = {d: evaluate(field, test, args.samples, views=v, **render)["psnr"] for d, v in groups.items()}
        finally:
            field.occupancy = kept
        print(f"[{name}] the same without occupancy grids: " + ", ".join(f"{d}: {p:.2f} dB" for d, p in plain.items()))
    if args.lod_images:
        closest = next(iter(groups.values()))[0]   # the first view of the nearest sphere
        save_with_error(os.path.join(args.out, f"closest_{name}_{_variant_slug(args)}_"), near["renders"][closest],
                        test.images[closest].to(near["renders"].device))
    frame_s = seconds_per_frame(lambda: field.render_image(test.c2w[0], test.width, test.height, test.focal,
                                                           args.samples, background=test.background.float(),
                                                           **render), 5 if tinn.runtime.arch() == "cuda" else 1)
    truth = mesh_truth(read_mesh(path), test.background.float(), supersample=args.lod_supersample)
    poses = test.c2w[:args.lod_views] if args.lod_views > 0 else test.c2w
    diagnosis = LodDiagnosis(os.path.join(args.out, f"lod_{name}_{_variant_slug(args)}"), test.background.float()) \
        if args.lod_images else None
    on_frame = diagnosis.frame if diagnosis else None
    curve = []
    for factors, k in [(_floats(args.lod_factors), None)] + [([f], k) for f, k in lod_rays(args.lod_rays)]:
        rays = {} if k is None else {"supersample": k}
        if diagnosis:
            diagnosis.tag = "" if k is None else f"{k}x{k}rays_"
        rows = lod_curve(field, truth, poses, test.width, test.height, test.focal, args.samples, factors,
                         background=test.background.float(), on_frame=on_frame, **rays, **render)
        if diagnosis:
            diagnosis.annotate(rows)
        curve += rows
    print(f"[{name}] held-out {near['psnr']:.2f} dB; level of detail ({len(poses)} held-out views pulled back; "
          f"truth area-filtered {args.lod_supersample}^2):")
    print(format_curve(curve))
    return {"psnr": near["psnr"], "psnr_by_distance": by_distance, "seconds": timing["seconds"],
            "steps": timing["steps"],
            "blend_margin": args.blend_margin, "final_lr_factor": args.octree_final_lr,
            "variant": {key: getattr(args, key) for key in VARIANT_KEYS}, "label": _variant_label(args),
            "occupancy_seconds": occupancy_s, "params": octree_params,
            "param_bytes": field.memory_bytes(), "frame_ms": 1e3 * frame_s, "nodes": field.n_nodes,
            "nodes_per_level": field.octree.nodes_per_level(), "encoding": enc,
            "lod_resolution": field.lod_resolution, "pyramid_levels": timing["pyramid_levels"],
            "fraction_touched": near["fraction_touched"], "lod_curve": curve}


def lod_rays(text: str) -> list[tuple[float, int]]:
    """--lod-rays' factor:k pairs."""
    pairs = []
    for pair in filter(None, (p.strip() for p in text.split(","))):
        try:
            factor, k = pair.split(":")
            pairs.append((float(factor), int(k)))
        except ValueError:
            raise SystemExit(f"--lod-rays {text!r}: each entry must be factor:k (a distance factor and rays per "
                             f"pixel side, e.g. 2:2), got {pair!r}")
    return pairs


class LodDiagnosis:
    """Where a level-of-detail row's error lies: the silhouette band (pixels within one pixel of both the
    background and the object in the truth) against the rest, pooled over the row's views, and the first view's
    prediction, truth and error (x8) as PNGs."""

    def __init__(self, prefix: str, background: torch.Tensor):
        self.prefix, self.background = prefix, background
        self.tag = ""  # told apart in the file names: rows drawn with several rays a pixel
        self.sums: dict = {}

    def frame(self, factor: float, view: int, pred: torch.Tensor, truth: torch.Tensor) -> None:
        import torch.nn.functional as F
        bg = self.background.to(truth.device).reshape(1, 1, 3)
        empty = ((truth - bg).abs().amax(-1) < 1e-3).float()[None, None]
        near_empty = F.max_pool2d(empty, 3, 1, 1)[0, 0] > 0
        near_object = F.max_pool2d(1 - empty, 3, 1, 1)[0, 0] > 0
        band = near_empty & near_object
        sq = ((pred - truth) ** 2).mean(-1)
        s = self.sums.setdefault(factor, [0.0, 0.0, 0, 0])
        s[0] += float(sq[band].sum())
        s[1] += float(sq[~band].sum())
        s[2] += int(band.sum())
        s[3] += int((~band).sum())
        if view == 0:
            save_with_error(f"{self.prefix}_x{factor:g}_{self.tag}", pred, truth)

    def annotate(self, curve: list[dict]) -> None:
        """Adds each row's split (the frames seen since the last call) and prints it."""
        for row in curve:
            band, rest, n_band, n_rest = self.sums.pop(row["factor"], (0.0, 0.0, 0, 0))
            total = band + rest
            row["silhouette"] = {"pixel_share": n_band / max(1, n_band + n_rest),
                                 "error_share": band / total if total else 0.0,
                                 "psnr_without": psnr_from_mse(rest / max(1, n_rest)),
                                 "psnr_band": psnr_from_mse(band / max(1, n_band))}
            print(f"  x{row['factor']:g} {row['supersample'] ** 2} rays/px: silhouette band "
                  f"{100 * row['silhouette']['pixel_share']:.1f}% of pixels, "
                  f"{100 * row['silhouette']['error_share']:.1f}% of the squared error; PSNR in the band "
                  f"{row['silhouette']['psnr_band']:.2f} dB, without it {row['silhouette']['psnr_without']:.2f} dB")


def save_with_error(prefix: str, pred: torch.Tensor, truth: torch.Tensor) -> None:
    """`prefix`pred.png, `prefix`truth.png and `prefix`error_x8.png (the absolute error times 8)."""
    for suffix, image in (("pred", pred), ("truth", truth), ("error_x8", (pred - truth).abs() * 8)):
        save_png(f"{prefix}{suffix}.png", image)


def _variant_slug(args) -> str:
    return "_".join(f"{getattr(args, key):g}" for key in VARIANT_KEYS if getattr(args, key) is not None)


def _variant_label(args) -> str:
    return ", ".join(f"{key.replace('_', '-')} {getattr(args, key):g}" for key in VARIANT_KEYS
                     if getattr(args, key) is not None)


def print_table(results: dict) -> None:
    print("| mesh | res | teacher dB (s, MiB) | KiloNeRF dB (s) | octree: nodes, variant | octree finest dB "
          "(s, steps, MiB, ms/frame) | gap to teacher | LoD curve: factor level dB touched |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        t, k = r["teacher"], r["kilonerf"]
        baselines = ("- | -" if k is None else f"{t['psnr']:.2f} ({t['seconds']:.1f}, {t['param_bytes'] / 2**20:.1f}) "
                     f"| {k['psnr']:.2f} ({k['seconds']:.1f})")
        for o in r["octree"]:
            curve = "; ".join(f"x{c['factor']:g} L{c['level']} {c['supersample'] ** 2}r {c['psnr']:.2f} "
                              f"{100 * c['fraction_touched']:.0f}%" for c in o["lod_curve"])
            gap = "-" if k is None else f"{o['psnr'] - t['psnr']:+.2f}"
            print(f"| {name} | {r['res']} | {baselines} "
                  f"| {o['nodes']}, {o['label']} "
                  f"| {o['psnr']:.2f} ({o['seconds']:.1f}, {o['steps']}, {o['param_bytes'] / 2**20:.1f}, "
                  f"{o['frame_ms']:.1f}) "
                  f"| {gap} | {curve} |")


def main(argv=None) -> dict:
    from tinn.distributed import start_script

    args = parse_args(argv)
    args.shard = False
    start_script(args)  # tinn.init, and the batch seed
    if tinn.runtime.arch() == "cpu":
        torch.set_num_threads(1)  # Taichi's CPU kernels bring their own threads (see demos/kilonerf.py)
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for item in args.meshes.split(","):
        item = item.strip()
        path = MESHES.get(item, item)
        name = item if item in MESHES else os.path.splitext(os.path.basename(item))[0]
        if not os.path.exists(path):
            raise SystemExit(f"mesh {path!r} not found (apt-get install glmark2-data assimp-testmodels)")
        results[name] = run_mesh(args, name, path)
        with open(args.json or os.path.join(args.out, "octree_quality.json"), "w") as f:
            json.dump({"arch": tinn.runtime.arch(), "argv": sys.argv[1:] if argv is None else argv,
                       "results": results}, f, indent=1)
    print_table(results)
    print(f"JSON: {args.json or os.path.join(args.out, 'octree_quality.json')}")
    return results


if __name__ == "__main__":
    main()

"""The scene demos' viewer sources, built as the demos build them, for `benchmarks.tools.web_viewer_cost`.

    source, describe = kilonerf_source(["--grid", "8"], "cuda", "out/x", phase="finetune", prep_steps=500)
    source, describe = octree_source([], "cuda", "out/y")

Each takes the demo's own command-line options (its defaults are its full size), so any size the demo offers can
be measured; the source is the object the demo hands to `tinn.viewer.serve` under `--viewer web`.
"""
from __future__ import annotations

from benchmarks.loading import load_file

# Toy sizes (--quick): seconds on a CPU, enough to run every condition and render a frame.
QUICK_ARGS = {
    "kilonerf": ["--small", "--grid", "2", "--res", "8", "--views", "2", "--test-views", "1", "--samples", "16",
                 "--batch-rays", "64", "--finetune-rays", "64", "--distill-batch", "256", "--occupancy-res", "8",
                 "--teacher-levels", "2", "--teacher-log2-hashmap", "8", "--hidden-layers", "1"],
    "octree": ["--small", "--res", "8", "--views", "2", "--test-views", "1", "--samples", "16", "--batch", "64",
               "--pyramid-levels", "1", "--max-depth", "1", "--points", "200"],
}
PHASES = ("teacher", "distill", "finetune")
# The measured phase's step count: it must not end (and hand over to the next phase) while it is measured.
ENDLESS = 10 ** 9


def kilonerf_source(demo_argv: list[str], arch: str, out: str, phase: str = "finetune", prep_steps: int = 500):
    """demos/kilonerf.py's pipeline, run through the phases before `phase` (`prep_steps` steps each) and left at
    the start of `phase`, which goes on for as long as it is trained. Returns (source, description)."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}; allowed: {', '.join(PHASES)}")
    demo = load_file("demos/kilonerf.py")
    measured = PHASES.index(phase)
    steps = []
    for i, name in enumerate(PHASES):
        steps += [f"--{name}-steps", str(prep_steps if i < measured else ENDLESS if i == measured else 0)]
    args = demo.parse_args(demo_argv + steps + ["--arch", arch, "--out", out])
    demo.start_script(args)
    train, test = demo.load_data(args)
    pipe = demo.KiloNeRFPipeline(args, train, test)
    while pipe.phase != phase:
        pipe.run_phase()
    rays = {"teacher": args.batch_rays, "distill": None, "finetune": args.finetune_rays}[phase]
    return pipe, {"phase": phase, "prep_steps": prep_steps, "networks": pipe.student.n_networks,
                  "res": [test.width, test.height], "samples": args.samples, "rays_per_step": rays,
                  "points_per_step": args.distill_batch if phase == "distill" else None}


def octree_source(demo_argv: list[str], arch: str, out: str):
    """demos/octree_lod.py's OctreeSource over its field and trainer. Returns (source, description)."""
    import tinn

    demo = load_file("demos/octree_lod.py")
    args = demo.parse_args(demo_argv + ["--arch", arch, "--out", out])
    demo.start_script(args)
    demo.apply_defaults(args, arch == "cuda")
    train, test, points = demo.load_scene(args)
    dev = tinn.runtime.device()
    train, test = train.to(dev), test.to(dev)
    field = demo.build_field(args, train, points)
    trainer = demo.build_trainer(args, field, train)
    source = demo.OctreeSource(trainer, test, args.samples)
    return source, {"nodes": field.octree.n_nodes, "res": [test.width, test.height], "samples": args.samples,
                    "rays_per_step": args.batch, "pyramid_levels": args.pyramid_levels}

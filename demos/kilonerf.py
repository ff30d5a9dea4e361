"""KiloNeRF in tinn: a scene as a regular grid of thousands of tiny networks, evaluated in one launch.

    python demos/kilonerf.py                         # full size: 16^3 = 4096 networks, 100 views at 100 px (GPU)
    python demos/kilonerf.py --small                 # CPU-sized: 4^3 networks, 24 views at 32 px
    python demos/kilonerf.py --data nerf_synthetic/lego --res 100
    python demos/kilonerf.py --small --gui [--headless]   # the training viewer (phases shown live)
    python demos/kilonerf.py --viewer web                 # the viewer as a page: http://127.0.0.1:8080
    torchrun --nproc_per_node 2 demos/kilonerf.py --shard [--small]   # cells sharded over 2 GPUs (gloo on CPUs)

Phases: (1) a teacher (one hash grid + 64-wide MLP) learns the training images; (2) an occupancy
grid is filled from the teacher's density; (3) distillation: every cell's network fits the teacher
at random points of occupied space; (4) fine-tuning of the grid of networks on the images through
the compositor, with empty space skipped. Prints and returns held-out PSNR (teacher and student),
time per phase, render time per frame, memory and the share of samples skipped; writes PNGs of a
held-out view (prediction vs ground truth) and summary.json to --out.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

import tinn  # noqa: E402
from tinn.distributed import start_script  # noqa: E402
from tinn.progress import ProgressBar  # noqa: E402
from tinn.viewer.cli import add_viewer_args, open_viewer, viewer_kind  # noqa: E402

# Full size (the defaults) and --small; an explicit flag wins over both.
FULL = {"grid": 16, "views": 100, "test_views": 4, "res": 100, "samples": 128, "batch_rays": 8192,
        "teacher_steps": 1000, "distill_steps": 1000, "finetune_steps": 1000, "distill_batch": 1 << 19,
        "finetune_rays": 1 << 16, "hidden_layers": 3, "occupancy_res": 128, "teacher_levels": 16,
        "teacher_log2_hashmap": 19, "teacher_base": 16, "teacher_hidden_layers": 2, "teacher_lr": 1e-2}
SMALL = {"grid": 4, "views": 24, "test_views": 2, "res": 32, "samples": 32, "batch_rays": 512,
         "teacher_steps": 200, "distill_steps": 200, "finetune_steps": 100, "distill_batch": 8192,
         "finetune_rays": 512, "hidden_layers": 2, "occupancy_res": 32, "teacher_levels": 8,
         "teacher_log2_hashmap": 14, "teacher_base": 4, "teacher_hidden_layers": 1, "teacher_lr": 3e-2}
PHASES = ("teacher", "distill", "finetune")


def teacher_precision(choice: str) -> str | None:
    """The teacher network's precision: a named one, or for "auto" float16 on CUDA (tcnn's; one network there
    trains as well as in float32 in a third less time, docs/performance.md) unless the process's settings
    name a precision, which then applies (None)."""
    if choice != "auto":
        return choice
    return "float16" if tinn.runtime.arch() == "cuda" and tinn.runtime.settings().precision == "auto" else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scene", default="procedural", choices=["procedural"], help="built-in scene (default)")
    p.add_argument("--data", default=None, help="a scene folder: NeRF-synthetic, instant-ngp or nerfstudio "
                   "(transforms*.json); replaces --scene")
    p.add_argument("--mesh", default=None, help="an .obj or .ply mesh, rendered into --out/mesh_scene first")
    p.add_argument("--camera-radii", default="4",
                   help="with --mesh: the cameras' distances from the mesh centre, comma-separated (the views split "
                        "evenly; closer spheres give close-ups)")
    p.add_argument("--small", action="store_true", help="CPU-sized run (smaller grid, views, steps)")
    p.add_argument("--grid", type=int, default=None, help="cells per axis (networks: grid^3); full size 16")
    p.add_argument("--views", type=int, default=None, help="training views (full size 100)")
    p.add_argument("--test-views", type=int, default=None, help="held-out views for PSNR (full size 4)")
    p.add_argument("--res", type=int, default=None, help="image width and height in pixels (full size 100)")
    p.add_argument("--samples", type=int, default=None, help="samples per ray across the scene box (full size 128)")
    p.add_argument("--batch-rays", type=int, default=None, help="rays per teacher step (full size 8192)")
    p.add_argument("--finetune-rays", type=int, default=None, help="rays per student fine-tuning step (full 2^16)")
    p.add_argument("--teacher-steps", type=int, default=None, help="teacher training steps (full size 1000)")
    p.add_argument("--distill-steps", type=int, default=None, help="distillation steps (full size 1000)")
    p.add_argument("--finetune-steps", type=int, default=None, help="student fine-tuning steps (full size 1000)")
    p.add_argument("--distill-batch", type=int, default=None, help="points per distillation step (full size 2^19)")
    p.add_argument("--occupancy-res", type=int, default=None, help="occupancy voxels per axis (full size 128)")
    p.add_argument("--frequencies", type=int, default=4, help="Frequency-encoding octaves of each cell's network")
    p.add_argument("--neurons", type=int, default=32, choices=[16, 32, 64], help="width of each cell's network")
    p.add_argument("--hidden-layers", type=int, default=None, help="hidden layers of each cell's network (full 3)")
    p.add_argument("--teacher-levels", type=int, default=None, help="teacher hash-grid levels (full size 16)")
    p.add_argument("--teacher-log2-hashmap", type=int, default=None, help="teacher hash table size, log2 (full 19)")
    p.add_argument("--teacher-base", type=int, default=None, help="teacher's coarsest grid resolution (full 16)")
    p.add_argument("--teacher-hidden-layers", type=int, default=None, help="teacher MLP hidden layers (full 2)")
    p.add_argument("--teacher-lr", type=float, default=None, help="teacher learning rate (full 1e-2, small 3e-2)")
    p.add_argument("--teacher-precision", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                   help="the teacher MLP's precision; auto: tcnn's float16 on CUDA (unless the settings name one), "
                        "the settings' choice elsewhere")
    p.add_argument("--distill-lr", type=float, default=1e-2)
    p.add_argument("--finetune-lr", type=float, default=2e-3)
    p.add_argument("--finetune-final-lr-factor", type=float, default=0.01,
                   help="fine-tuning's learning rate decays to finetune-lr times this")
    p.add_argument("--alpha-threshold", type=float, default=0.01,
                   help="a voxel is occupied where one render step of the teacher's density has alpha above this")
    p.add_argument("--fixed-teacher-occupancy", action="store_true",
                   help="train the teacher on every sample (no occupancy grid tracking it during training)")
    p.add_argument("--fixed-student-occupancy", action="store_true",
                   help="fine-tune the student in the teacher's grid as it is (no grid tracking the student)")
    p.add_argument("--render-segments", type=int, default=None,
                   help="early ray termination: runs of samples per ray (1: every sample in one run; default 1 on "
                        "CUDA, where the array's tensor-core call costs more than the samples it would skip, 2 "
                        "on the CPU)")
    p.add_argument("--early-stop", type=float, default=1e-4,
                   help="a ray ends once its transmittance is below this (0: never)")
    p.add_argument("--profile-render", action="store_true",
                   help="also profile one KiloNeRF frame (torch.profiler): render_profile.txt in --out")
    p.add_argument("--out", default="out/kilonerf", help="output directory for PNGs and summary.json")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--seed", type=int, default=0)
    add_viewer_args(p)
    p.add_argument("--frame-every", type=int, default=None, help="viewer: save a frame every K steps")
    p.add_argument("--shard", action="store_true",
                   help="under torchrun: the cells' networks sharded over the ranks, the teacher replicated, "
                        "each rank training on its own rays (only rank 0 prints and writes --out)")
    args = p.parse_args(argv)
    if args.shard and viewer_kind(args):
        p.error("--shard runs without the viewer")
    for key, value in (SMALL if args.small else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    for key in ("grid", "views", "test_views", "res", "samples", "batch_rays", "finetune_rays", "distill_batch",
                "occupancy_res", "hidden_layers"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if not 0.0 < args.finetune_final_lr_factor <= 1.0:
        p.error(f"--finetune-final-lr-factor must be in (0, 1], got {args.finetune_final_lr_factor}")
    for key in ("teacher_steps", "distill_steps", "finetune_steps"):
        if getattr(args, key) < 0:
            p.error(f"--{key.replace('_', '-')} must be >= 0, got {getattr(args, key)}")
    return args


def render_segments(args) -> int:
    """--render-segments, or its default for this process's arch (1 on CUDA, 2 on the CPU)."""
    if args.render_segments is not None:
        return args.render_segments
    return 1 if tinn.runtime.arch() == "cuda" else 2


def load_data(args):
    """(train, test) PosedImages on tinn's device."""
    from tinn.scenes import ProceduralScene, render_views
    from tinn.scenes.data.formats import load_scene
    from tinn.scenes.data.mesh import parse_radii, scene_from_mesh

    if args.mesh:
        args.data = scene_from_mesh(args.mesh, os.path.join(args.out, "mesh_scene"), args.views, args.test_views,
                                    args.res, radii=parse_radii(args.camera_radii))
    if args.data is None:
        scene = ProceduralScene()
        # Different seeds: held-out cameras are not training cameras.
        return (render_views(scene, args.views, args.res, args.res, seed=args.seed),
                render_views(scene, args.test_views, args.res, args.res, seed=args.seed + 1000))
    probe = load_scene(args.data, "train", max_views=1)
    factor = max(1, round(probe.width / args.res))
    dev = tinn.runtime.device()
    train = load_scene(args.data, "train", downscale=factor, max_views=args.views).to(dev)
    test = load_scene(args.data, "test", downscale=factor, max_views=args.test_views).to(dev)
    return train, test


def shard_fields(teacher, student, student_seed: int) -> None:
    """Sharded mode: the student's cells spread over the ranks (the same initial values as unsharded), the
    teacher replicated on every rank with its gradients averaged."""
    import tinn.distributed as td
    from tinn.models import NetworkWithInputEncoding

    teacher.model = td.Replicated(teacher.model)
    student.networks = td.ShardedPart(
        lambda n: NetworkWithInputEncoding(3, 4, student.encoding_config, student.network_config, n_networks=n,
                                           seed=student_seed), student.n_networks,
        config={"encoding": student.encoding_config, "network": student.network_config})



class KiloNeRFPipeline:
    """Teacher -> occupancy -> distillation -> fine-tuning, one step at a time; also a viewer source."""

    def __init__(self, args, train, test):
        from tinn.scenes.fields.kilonerf import KiloNeRF
        from tinn.scenes.fields import HashGridField
        from tinn.scenes.acceleration.occupancy import OccupancyGrid
        from tinn.scenes.training.photometric import PhotometricTrainer

        self.args, self.train, self.test = args, train, test
        self.steps = {"teacher": args.teacher_steps, "distill": args.distill_steps, "finetune": args.finetune_steps}
        self.n_steps = sum(self.steps.values())
        self.render_step = float((train.box_max - train.box_min).norm()) / args.samples  # longest sample spacing
        self.teacher = HashGridField(train.box_min, train.box_max, n_levels=args.teacher_levels,
                                     log2_hashmap_size=args.teacher_log2_hashmap, base_resolution=args.teacher_base,
                                     finest_resolution=max(4 * args.res, args.teacher_base), n_neurons=64,
                                     n_hidden_layers=args.teacher_hidden_layers, seed=args.seed + 1,
                                     precision=teacher_precision(args.teacher_precision))
        self.student = KiloNeRF(train.box_min, train.box_max, grid=args.grid, n_frequencies=args.frequencies,
                                n_neurons=args.neurons, n_hidden_layers=args.hidden_layers, seed=args.seed + 2)
        if args.shard:
            shard_fields(self.teacher, self.student, args.seed + 2)
        # The teacher trains with a density grid that tracks it (instant-ngp): samples in voxels it leaves
        # empty are skipped, so density painted into empty space is not reinforced and decays from the grid.
        # (Sharded runs keep the fixed grid: each rank would track its own.)
        self.teacher_occupancy = None if args.fixed_teacher_occupancy or args.shard else \
            OccupancyGrid.tracking(train.box_min, train.box_max, args.occupancy_res)
        self.trainers = {"teacher": PhotometricTrainer(self.teacher, train, args.samples, args.batch_rays,
                                                       args.teacher_lr, total_steps=args.teacher_steps,
                                                       seed=args.batch_seed, occupancy=self.teacher_occupancy,
                                                       occupancy_threshold=self.density_threshold())}
        self.times = {"teacher": 0.0, "occupancy": 0.0, "distill": 0.0, "finetune": 0.0}
        self.phase_index, self.phase_step, self.last_loss = 0, 0, None
        self.distill_error, self.psnr_distilled = None, None
        self._skip_empty_phases()

    def density_threshold(self) -> float:
        """Occupied: one render step through the voxel's densest point would reach alpha_threshold."""
        return -math.log1p(-self.args.alpha_threshold) / self.render_step

    # ---- phases -------------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        return PHASES[self.phase_index] if self.phase_index < len(PHASES) else "done"

    def _skip_empty_phases(self) -> None:
        while self.phase != "done" and self.phase_step >= self.steps[self.phase]:
            self._finish_phase()

    def _finish_phase(self) -> None:
        """End the current phase and set up the next (occupancy grid and distiller after the teacher, ...)."""
        from tinn.scenes.fields import RenderedField
        from tinn.scenes.training import Distiller
        from tinn.scenes.acceleration.occupancy import OccupancyGrid
        from tinn.render import timed

        args, finished = self.args, self.phase
        self.phase_index += 1
        self.phase_step = 0
        if finished == "teacher":
            threshold = self.density_threshold()
            # The student learns the teacher as it renders: with the grid that tracked it, outside which the
            # teacher's density was never trained nor seen.
            self.teacher_rendered = self.teacher if self.teacher_occupancy is None else \
                RenderedField(self.teacher, self.teacher_occupancy)
            self.occupancy, seconds = timed(OccupancyGrid.from_density, self.teacher_rendered.density,
                                            self.train.box_min,
                                            self.train.box_max, args.occupancy_res, threshold, seed=args.seed)
            self.times["occupancy"] += seconds
            self.student.occupancy = self.occupancy
            self.trainers["distill"] = Distiller(self.student, self.teacher_rendered, self.occupancy,
                                                 self.render_step,
                                                 batch=args.distill_batch, learning_rate=args.distill_lr,
                                                 total_steps=args.distill_steps, seed=args.batch_seed)
        elif finished == "distill":
            self.distill_error = self.trainers["distill"].error()
            self.psnr_distilled = self.heldout_psnr(self.student)  # before fine-tuning, to show what it adds
            # The student fine-tunes with a grid that tracks it inside the teacher's: voxels where it keeps only
            # faint density (smeared by distillation from the teacher's faint floaters) leave training and
            # rendering instead of showing as voxel-shaped haze. (Sharded runs keep the fixed grid.)
            self.trainers["finetune"] = self.finetuner(self.student,
                                                       tracks=not (args.fixed_student_occupancy or args.shard))

    def finetuner(self, student, tracks: bool = True, rays: int | None = None, learning_rate: float | None = None,
                  final_lr_factor: float | None = None, steps: int | None = None, adam_options: dict | None = None):
        """The fine-tuning phase of `student` (the args' settings unless given): photometric training with the
        student's own grid tracking it inside the teacher-derived one (`tracks`), or with that grid as it is.
        Sets the student's occupancy grid."""
        from tinn.scenes.acceleration.occupancy import OccupancyGrid
        from tinn.scenes.training.photometric import PhotometricTrainer

        args = self.args
        grid = OccupancyGrid.tracking(self.train.box_min, self.train.box_max, args.occupancy_res,
                                      within=self.occupancy) if tracks else self.occupancy
        student.occupancy = grid
        return PhotometricTrainer(student, self.train, args.samples, rays or args.finetune_rays,
                                  learning_rate or args.finetune_lr, occupancy=grid,
                                  final_lr_factor=final_lr_factor or args.finetune_final_lr_factor,
                                  occupancy_threshold=self.density_threshold(),
                                  total_steps=args.finetune_steps if steps is None else steps,
                                  seed=args.batch_seed + 1, adam_options=adam_options)

    def train_step(self) -> torch.Tensor:
        """One step of the current phase (the viewer's `train_step`); moves on to the next phase when it is done."""
        # Past the planned steps (a viewer resumed after the end) fine-tuning goes on.
        phase = self.phase if self.phase != "done" else "finetune"
        t0 = time.perf_counter()
        self.last_loss = self.trainers[phase].step()
        tinn.runtime.sync()
        self.times[phase] += time.perf_counter() - t0
        if self.phase != "done":
            self.phase_step += 1
            self._skip_empty_phases()
        return self.last_loss

    def run_phase(self, bar: ProgressBar | None = None, offset: int = 0) -> str:
        """Run the current phase to its end (timed as a whole: no per-step sync). Returns its name."""
        phase = self.phase
        trainer, n = self.trainers[phase], self.steps[phase]
        log_every = max(n // 10, 1)
        tinn.runtime.sync()
        t0 = time.perf_counter()
        for i in range(self.phase_step, n):
            self.last_loss = trainer.step()
            if bar is not None and ((i + 1) % log_every == 0 or i + 1 == n):
                bar.update(offset + i + 1, phase=phase, loss=float(self.last_loss))
        tinn.runtime.sync()
        self.times[phase] += time.perf_counter() - t0
        self.phase_step = n
        self._skip_empty_phases()
        return phase

    # ---- models and views ---------------------------------------------------------------------
    def current_model(self):
        """The model being trained: the teacher first, the grid of networks from distillation on."""
        return self.teacher if self.phase == "teacher" else self.student

    def render_view(self, model, view: int = 0, occupancy="auto", early_stop=None):
        return self.render_pose(model, self.test.c2w[view], occupancy, early_stop)

    def render_pose(self, model, c2w, occupancy="auto", early_stop=None, width=None, height=None, focal=None):
        """`model` seen from the camera-to-world pose `c2w` (4, 4), by default with the held-out views' size and
        focal."""
        from tinn.render import render_image

        c2w = torch.as_tensor(c2w, dtype=torch.float32, device=self.test.c2w.device)
        t = self.test
        return render_image(model, c2w, width or t.width, height or t.height, focal or t.focal,
                            n_samples=self.args.samples, background=self.test.background, occupancy=occupancy,
                            segments=render_segments(self.args),
                            early_stop=self.args.early_stop if early_stop is None else early_stop)

    def heldout(self, model, occupancy="auto") -> tuple[float, float]:
        """Mean PSNR over the held-out views, and the share of their in-box samples that empty-space skipping left
        out (rendered without early ray termination, so that the share is the occupancy grid's alone)."""
        from tinn.tasks.image import psnr

        views = [self.render_view(model, v, occupancy, early_stop=0.0) for v in range(len(self.test))]
        value = sum(psnr(out.rgb, self.test.images[v]) for v, out in enumerate(views)) / len(views)
        candidates = sum(out.n_candidates for out in views)
        evaluated = sum(out.n_evaluated for out in views)
        return value, (1.0 - evaluated / candidates if candidates else 0.0)

    def heldout_psnr(self, model, occupancy="auto") -> float:
        return self.heldout(model, occupancy)[0]

    # viewer source
    def render(self) -> torch.Tensor:
        return self.render_view(self.current_model()).rgb

    def reference(self) -> torch.Tensor:
        return self.test.images[0]

    def render_from(self, c2w) -> torch.Tensor:
        """The viewer's orbit camera: the current model from any pose."""
        return self.render_pose(self.current_model(), c2w).rgb

    def render_camera(self, c2w, width, height, focal) -> torch.Tensor:
        """The current model from any pose at any size (the web viewer's cameras)."""
        return self.render_pose(self.current_model(), c2w, width=width, height=height, focal=focal).rgb

    def orbit_start(self):
        """The orbit starts at held-out view 0 (render()'s) and turns around the scene box's centre."""
        return self.test.c2w[0], (self.train.box_min + self.train.box_max) / 2

    @property
    def learning_rate(self) -> float:
        return self.trainers[self.phase if self.phase != "done" else "finetune"].learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.trainers[self.phase if self.phase != "done" else "finetune"].learning_rate = value


def report(pipe: KiloNeRFPipeline, out_dir: str, timing_repeats: int) -> dict:
    """Held-out numbers, render timings, memory; PNGs of held-out view 0."""
    from tinn.render import seconds_per_frame
    from tinn.tasks.image import psnr, save_png

    test, args = pipe.test, pipe.args
    teacher_view = pipe.render_view(pipe.teacher, occupancy=pipe.teacher_occupancy)
    student_view = pipe.render_view(pipe.student)
    truth = test.images[0]
    save_png(os.path.join(out_dir, "heldout_student.png"), student_view.rgb)
    save_png(os.path.join(out_dir, "heldout_teacher.png"), teacher_view.rgb)
    save_png(os.path.join(out_dir, "heldout_truth.png"), truth)
    save_png(os.path.join(out_dir, "heldout_comparison.png"), torch.cat([student_view.rgb, teacher_view.rgb, truth], 1))
    background = test.background.reshape(1, 1, 3).expand_as(test.images[0])
    psnr_student, skipped = pipe.heldout(pipe.student)
    teacher_network = next(m for m in pipe.teacher.modules() if isinstance(m, tinn.NetworkArray))
    summary = {
        "arch": tinn.runtime.arch(), "scene": args.data or args.scene, "grid": args.grid,
        "n_networks": pipe.student.n_networks, "views": len(pipe.train), "test_views": len(test),
        "res": [test.width, test.height], "samples_per_ray": args.samples,
        "steps": dict(pipe.steps),
        "student_network": {"n_frequencies": args.frequencies, "n_neurons": args.neurons,
                            "n_hidden_layers": args.hidden_layers},
        "teacher_network": {"path": teacher_network.path, "precision": teacher_network.precision},
        "rays_per_step": {"teacher": args.batch_rays, "finetune": args.finetune_rays},
        "psnr_background": sum(psnr(background, image) for image in test.images) / len(test),
        # The teacher as it trains and as instant-ngp renders it: with its tracked density grid (samples in
        # voxels it keeps empty were never trained); every sample evaluated shows what lies outside it too.
        "psnr_teacher": pipe.heldout_psnr(pipe.teacher, occupancy=pipe.teacher_occupancy),
        "psnr_teacher_every_sample": pipe.heldout_psnr(pipe.teacher, occupancy=None),
        "psnr_student": psnr_student,
        "psnr_student_distilled": pipe.psnr_distilled,
        "distill_error": pipe.distill_error,
        "time_s": {k: round(v, 3) for k, v in pipe.times.items()},
        "occupied_fraction": pipe.occupancy.occupied_fraction(),
        "teacher_tracked_occupied_fraction": (None if pipe.teacher_occupancy is None
                                              else pipe.teacher_occupancy.occupied_fraction()),
        "student_occupied_fraction": pipe.student.occupancy.occupied_fraction(),
        "skipped_fraction": skipped,
        "param_bytes_teacher": pipe.teacher.memory_bytes(),
        "param_bytes_student": pipe.student.networks.memory_bytes(),
        "occupancy_bytes": pipe.occupancy.memory_bytes(),
    }
    renders = {"teacher": lambda: pipe.render_view(pipe.teacher, occupancy=None),
               "teacher_skipping": lambda: pipe.render_view(pipe.teacher, occupancy=pipe.occupancy),
               "student": lambda: pipe.render_view(pipe.student),
               "student_one_run": lambda: pipe.render_view(pipe.student, early_stop=0.0)}
    ms = {name: 1e3 * seconds_per_frame(fn, timing_repeats) for name, fn in renders.items()}
    summary["render_ms_per_frame"] = {k: round(v, 3) for k, v in ms.items()}
    summary["frames_per_second"] = {k: round(1e3 / v, 2) for k, v in ms.items()}
    if torch.cuda.is_available() and tinn.runtime.arch() == "cuda":
        summary["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return summary


def profile_render(pipe: KiloNeRFPipeline, path: str) -> None:
    """Kernel and operator times of one KiloNeRF frame (after a warm-up frame), by total device time."""
    from torch.profiler import ProfilerActivity, profile

    pipe.render_view(pipe.student)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        pipe.render_view(pipe.student)
        tinn.runtime.sync()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=40)
    with open(path, "w") as f:
        f.write(table)
    print(table)


def print_summary(s: dict) -> None:
    t = s["time_s"]
    distilled = "-" if s["psnr_student_distilled"] is None else f"{s['psnr_student_distilled']:.2f}"
    print(f"held-out PSNR: teacher {s['psnr_teacher']:.2f} dB (every sample {s['psnr_teacher_every_sample']:.2f} dB), "
          f"KiloNeRF {s['psnr_student']:.2f} dB "
          f"(after distillation {distilled} dB; background only {s['psnr_background']:.2f} dB) "
          f"over {s['test_views']} views")
    print(f"training time: teacher {t['teacher']:.1f} s, occupancy {t['occupancy']:.2f} s, "
          f"distillation {t['distill']:.1f} s, fine-tuning {t['finetune']:.1f} s")
    r, f = s["render_ms_per_frame"], s["frames_per_second"]
    w, h = s["res"]
    print(f"render {w}x{h}, {s['samples_per_ray']} samples/ray: "
          f"teacher {r['teacher']:.1f} ms ({f['teacher']:.1f} fps), "
          f"teacher+skipping {r['teacher_skipping']:.1f} ms, KiloNeRF {r['student']:.1f} ms ({f['student']:.1f} fps; "
          f"without early termination {r['student_one_run']:.1f} ms)")
    print(f"empty space: {100 * s['occupied_fraction']:.1f}% of voxels occupied by the teacher's grid, "
          f"{100 * s['student_occupied_fraction']:.1f}% by the student's, "
          f"{100 * s['skipped_fraction']:.1f}% of in-box samples skipped")
    mem = (f"memory: KiloNeRF {s['n_networks']} networks {s['param_bytes_student'] / 2**20:.2f} MiB, "
           f"teacher {s['param_bytes_teacher'] / 2**20:.2f} MiB, occupancy {s['occupancy_bytes'] / 2**20:.2f} MiB")
    if "peak_gpu_mib" in s:
        mem += f", peak GPU (torch) {s['peak_gpu_mib']:.0f} MiB"
    print(mem)


def run(argv=None) -> dict:
    args = parse_args(argv)
    arch = start_script(args)  # tinn, and with --shard the process group
    threads = torch.get_num_threads()
    if arch == "cpu":
        # Taichi's CPU kernels have their own thread pool; torch's OpenMP threads competing for the same cores
        # made each training step 2-3x slower here. Restored on exit (tests call run() in-process).
        torch.set_num_threads(1)
    try:
        return _run(args, arch)
    finally:
        torch.set_num_threads(threads)
        if args.shard:
            import tinn.distributed as td

            td.shutdown()


def _run(args, arch: str) -> dict:
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    train, test = load_data(args)
    data_s = time.perf_counter() - t0
    pipe = KiloNeRFPipeline(args, train, test)
    print(f"tinn {tinn.__version__} on {arch}: KiloNeRF {args.grid}^3 = {pipe.student.n_networks} networks, "
          f"{len(train)} views at {train.width}x{train.height}, {args.samples} samples/ray; steps "
          f"teacher {args.teacher_steps}, distill {args.distill_steps}, finetune {args.finetune_steps} "
          f"(data {data_s:.1f} s)")
    viewer_summary = None
    if viewer_kind(args):
        viewer = open_viewer(args, pipe, args.out, "tinn KiloNeRF", frame_every=args.frame_every)
        viewer_summary = viewer.run(pipe.n_steps)
    else:
        bar = ProgressBar(pipe.n_steps)
        done = 0
        while pipe.phase != "done":
            done += pipe.steps[pipe.run_phase(bar, offset=done)]
        bar.close()
    if pipe.phase != "done":  # a viewer closed early: finish the phases so the report is complete
        while pipe.phase != "done":
            pipe.run_phase()
    summary = report(pipe, args.out, timing_repeats=10 if arch == "cuda" else 2)
    summary["time_s"]["data"] = round(data_s, 3)
    if viewer_summary is not None:
        summary["viewer"] = {k: viewer_summary[k] for k in ("backend", "steps", "frames") if k in viewer_summary}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    if args.profile_render:
        profile_render(pipe, os.path.join(args.out, "render_profile.txt"))
    print_summary(summary)
    print(f"PNGs and summary.json in {args.out}")
    return summary


if __name__ == "__main__":
    run()

"""Learn an image (x, y) -> RGB, like tiny-cuda-nn's mlp_learning_an_image sample.

    tinn-image                                   # embedded default image, one network
    tinn-image --tiles 8                         # array mode: 64 tiny networks, one per tile
    tinn-image --image photo.png --config config_hash.json
    tinn-image --tiles 4 --viewer web            # watch and steer it at http://127.0.0.1:8080

(`python demos/mlp_learning_an_image.py ...` in a checkout runs the same.)

Writes PNGs of the prediction at the chosen steps and prints step, loss, PSNR, steps/s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import tinn
from tinn.progress import ProgressBar
from tinn.viewer.cli import add_viewer_args, open_viewer, viewer_kind

# A bare name is one of the configs shipped in tinn/configs (tinn.load_config finds it from any directory).
DEFAULT_CONFIG = "config.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tinn-image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="tcnn-style JSON config")
    p.add_argument("--image", default=None, help="image file (default: embedded procedural image)")
    p.add_argument("--size", type=int, default=256, help="side of the embedded default image")
    p.add_argument("--tiles", type=int, default=1, help="array mode: tiles per side, one network per tile")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: 1000 GPU / 300 CPU)")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: 2^18 GPU / 2^13 CPU)")
    p.add_argument("--save-at", default=None, help="comma-separated steps to write PNGs at (default: last)")
    p.add_argument("--log-every", type=int, default=None, help="print/evaluate PSNR every N steps")
    p.add_argument("--out", default="out/image", help="output directory for PNGs and summary.json")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--seed", type=int, default=1337)
    add_viewer_args(p)
    return p.parse_args(argv)


def run(argv=None) -> dict:
    """Train on the image as the command line `argv` says and return the summary (also in summary.json).

    Returns:
        A dict with `arch`, `steps`, `batch`, `n_networks`, `final_psnr`, `final_loss`, `steps_per_second`
        and `history` (step, loss, PSNR at each evaluation); with a viewer, the viewer's summary instead.
    """
    args = parse_args(argv)
    arch = tinn.init(args.arch)
    on_gpu = arch == "cuda"
    steps = args.steps or (1000 if on_gpu else 300)
    batch = args.batch or (1 << 18 if on_gpu else 1 << 13)
    config = tinn.load_config(args.config)

    from tinn.tasks.image import ImageTask, default_image, load_image, save_png
    from tinn.trainer import Trainer

    image = load_image(args.image) if args.image else default_image(args.size)
    task = ImageTask(image, tiles=args.tiles, seed=args.seed)
    trainer = Trainer.from_config(config, 2, 3, n_networks=task.n_networks, seed=args.seed)

    if viewer_kind(args):
        from tinn.viewer import ImageTrainerSource

        # --log-every doubles as the frame interval (headless default: every steps/10).
        viewer = open_viewer(args, ImageTrainerSource(trainer, task, batch), args.out, "tinn image",
                             frame_every=args.log_every)
        summary = viewer.run(steps)
        psnr = "-" if summary["final_psnr"] is None else f"{summary['final_psnr']:.2f}"
        print(f"viewer ({summary['backend']}): {summary['steps']} steps, PSNR {psnr} dB; "
              f"frames, loss_curve.png and summary.json in {args.out}")
        return summary

    os.makedirs(args.out, exist_ok=True)
    save_at = {int(s) for s in args.save_at.split(",")} if args.save_at else {steps}
    log_every = args.log_every or max(steps // 10, 1)
    print(f"tinn {tinn.__version__} on {arch}: {task.n_networks} network(s), image {task.width}x{task.height}, "
          f"batch {batch}, {steps} steps, config {os.path.basename(args.config)}")
    bar = ProgressBar(steps)
    history = []
    train_time = 0.0
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        x, target, ids = task.batch(batch)
        with tinn.checks.disabled():  # the task makes its own batches: no NaN scan or id check (a device sync)
            loss = trainer.training_step(x, target, ids)
        if step % log_every == 0 or step in save_at or step == steps:
            loss_value = float(loss)  # syncs
            train_time += time.perf_counter() - t0
            with trainer.inference_weights():
                prediction = task.render(trainer.model)
            value = task.psnr(prediction)
            history.append({"step": step, "loss": loss_value, "psnr": value})
            bar.update(step, loss=loss_value, psnr=value)
            if step in save_at:
                save_png(os.path.join(args.out, f"step_{step:06d}.png"), prediction)
        else:
            train_time += time.perf_counter() - t0
    bar.close()
    tinn.runtime.sync()
    save_png(os.path.join(args.out, "reference.png"), task.image)
    summary = {"arch": arch, "steps": steps, "batch": batch, "n_networks": task.n_networks,
               "final_psnr": history[-1]["psnr"], "final_loss": history[-1]["loss"],
               "steps_per_second": steps / train_time, "history": history}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"final PSNR {summary['final_psnr']:.2f} dB, {summary['steps_per_second']:.1f} steps/s; PNGs in {args.out}")
    return summary


def main(argv=None) -> int:
    """The `tinn-image` console script: `run` with an exit status, and a one-line error for bad input."""
    from tinn.errors import TinnError

    try:
        run(argv)
    except (TinnError, OSError) as exc:
        print(f"tinn-image: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tinn-viewer (or python -m tinn.viewer) --config config_hash.json [--image photo.png] [--tiles 8] [--headless --steps 300]
tinn-viewer --backend web [--port 8080]            # a page for any browser: http://127.0.0.1:8080

Learns an image in the viewer. Without a display or Vulkan it says so in one line and
runs headless, writing PNG frames, a loss-curve image and summary.json to --out.
"""
from __future__ import annotations

import argparse
import sys

# A bare name is one of the configs shipped in tinn/configs (tinn.load_config finds it from any directory).
DEFAULT_CONFIG = "config.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tinn-viewer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="tcnn-style JSON config: a path, or the name of a shipped one "
                                                          "(config.json, config_hash.json, config_oneblob.json)")
    p.add_argument("--image", default=None, help="image file (default: embedded procedural image)")
    p.add_argument("--size", type=int, default=256, help="side of the embedded default image")
    p.add_argument("--tiles", type=int, default=1, help="array mode: tiles per side, one network per tile")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default 1000 GPU / 300 CPU); a window pauses there, resume goes on")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default 2^18 GPU / 2^13 CPU)")
    p.add_argument("--headless", action="store_true", help="no window: write PNG frames to --out")
    p.add_argument("--frame-every", type=int, default=None, help="save a frame every K steps (headless: steps/10)")
    p.add_argument("--out", default="out/viewer", help="directory for frames, checkpoints, loss curve, summary")
    p.add_argument("--backend", choices=["auto", "ggui", "png", "web"], default=None,
                   help="png forces the numpy fallback, web serves a page at --host:--port (also TINN_VIEWER_BACKEND)")
    p.add_argument("--host", default="127.0.0.1", help="web: interface to listen on")
    p.add_argument("--port", type=int, default=8080, help="web: port")
    p.add_argument("--zoom", type=float, default=None, help="panel scale (default: fit)")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--seed", type=int, default=1337)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import tinn
    from tinn.errors import TinnError

    try:
        arch = tinn.init(args.arch)
        on_gpu = arch == "cuda"
        config = tinn.load_config(args.config)

        from tinn.tasks.image import ImageTask, default_image, load_image
        from tinn.trainer import Trainer

        image = load_image(args.image) if args.image else default_image(args.size)
        task = ImageTask(image, tiles=args.tiles, seed=args.seed)
        trainer = Trainer.from_config(config, 2, 3, n_networks=task.n_networks, seed=args.seed)
    except (TinnError, OSError) as exc:
        print(f"tinn.viewer: {exc}", file=sys.stderr)
        return 2
    from tinn.viewer import run_viewer

    steps = args.steps or (1000 if on_gpu else 300)
    summary = run_viewer(trainer, task, steps=steps, batch=args.batch or (1 << 18 if on_gpu else 1 << 13),
                         out_dir=args.out, headless=args.headless, frame_every=args.frame_every,
                         backend=args.backend, zoom=args.zoom, web={"host": args.host, "port": args.port})
    psnr = summary["final_psnr"]
    print(f"tinn.viewer: {summary['steps']} steps, loss {summary['final_loss']}, "
          f"PSNR {'-' if psnr is None else f'{psnr:.2f}'} dB; output in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

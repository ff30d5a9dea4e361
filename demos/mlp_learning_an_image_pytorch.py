"""Learn an image with tinn's tcnn-compatible PyTorch modules: a port of tiny-cuda-nn's
samples/mlp_learning_an_image_pytorch.py.

The only changes a tcnn user makes are the import (`import tinn.torch as tcnn`) and, for an array of
networks, the extra `net_ids` argument; this port also runs the backward on the calling thread
(`torch.autograd.set_multithreading_enabled(False)`, one line of PyTorch), which the loop's host time favours. Everything else is plain PyTorch: the relative L2 loss is computed
in torch exactly like tcnn's sample, and `torch.optim.Adam` updates the parameters in place.

    python demos/mlp_learning_an_image_pytorch.py                        # embedded default image
    python demos/mlp_learning_an_image_pytorch.py --image photo.jpg --config tinn/configs/config_hash.json
    python demos/mlp_learning_an_image_pytorch.py --tiles 8              # 64 networks, one per tile (net_ids)
    python demos/mlp_learning_an_image_pytorch.py --sequential           # Sequential(Encoding, Network)

Writes `reference.png`, `step_XXXXXX.png` at each log step, `result.png` and `summary.json` to --out;
prints step, loss, PSNR and time like tcnn's sample.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402  (was: import tinycudann as tcnn)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "..", "tinn", "configs", "config.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", default=None, help="any image imageio reads (default: embedded procedural image)")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="tcnn JSON config; its encoding and network are used")
    p.add_argument("--size", type=int, default=256, help="side of the embedded default image")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: 1000 GPU / 300 CPU)")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: 2^18 GPU / 2^13 CPU)")
    p.add_argument("--lr", type=float, default=1e-2, help="torch.optim.Adam learning rate (tcnn's sample: 0.01)")
    p.add_argument("--tiles", type=int, default=1, help="array mode: tiles per side, one network per tile")
    p.add_argument("--sequential", action="store_true",
                   help="torch.nn.Sequential(tcnn.Encoding, tcnn.Network) instead of NetworkWithInputEncoding")
    p.add_argument("--log-every", type=int, default=None, help="print, evaluate PSNR and save a PNG every N steps")
    p.add_argument("--out", default="out/image_pytorch", help="output directory for PNGs and summary.json")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--torch-backward-thread", action="store_true",
                   help="leave the backward on torch's device thread (its default) instead of the calling thread")
    return p.parse_args(argv)


def build_model(config: dict, n_channels: int, n_networks: int, sequential: bool, seed: int) -> torch.nn.Module:
    if sequential:
        # tcnn's sample: "equivalent to the above, but slower"; a Sequential passes no net_ids, so one network.
        if n_networks != 1:
            raise tinn.ConfigError("--sequential needs a single network (--tiles 1): Sequential cannot pass net_ids")
        encoding = tcnn.Encoding(n_input_dims=2, encoding_config=config["encoding"], seed=seed)
        network = tcnn.Network(n_input_dims=encoding.n_output_dims, n_output_dims=n_channels,
                               network_config=config["network"], seed=seed + 1)
        return torch.nn.Sequential(encoding, network)
    return tcnn.NetworkWithInputEncoding(n_input_dims=2, n_output_dims=n_channels, encoding_config=config["encoding"],
                                         network_config=config["network"], seed=seed, n_networks=n_networks)


def run(argv=None) -> dict:
    args = parse_args(argv)
    arch = tinn.init(args.arch)
    on_gpu = arch == "cuda"
    steps = args.steps or (1000 if on_gpu else 300)
    batch_size = args.batch or (1 << 18 if on_gpu else 1 << 13)
    log_every = args.log_every or max(steps // 10, 1)
    config = tinn.load_config(args.config)
    for key in ("encoding", "network"):
        if key not in config:
            raise tinn.ConfigError(f"{args.config}: section {key!r} is missing")

    from tinn.tasks.image import ImageTask, default_image, load_image, save_png

    image = load_image(args.image) if args.image else default_image(args.size)
    task = ImageTask(image, tiles=args.tiles, seed=args.seed)
    n_channels = task.image.shape[2]
    model = build_model(config, n_channels, task.n_networks, args.sequential, args.seed)
    print(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    os.makedirs(args.out, exist_ok=True)
    save_png(os.path.join(args.out, "reference.png"), task.image)
    print(f"tinn {tinn.__version__} on {arch}: {task.n_networks} network(s), image {task.width}x{task.height}, "
          f"batch {batch_size}, {steps} steps, {model.n_params() if hasattr(model, 'n_params') else '-'} params")

    def render() -> torch.Tensor:  # the prediction at every pixel centre, (H, W, 3)
        return task.render(lambda x, ids: model(x) if ids is None else model(x, ids))

    # One line beyond tcnn's sample: this loop is host-bound, and a CUDA backward handed to torch's device thread
    # costs a hand-over per step, on some machines much of the step (README, Performance); on the CPU the
    # backward runs here anyway. A block, so that a caller of run() gets its thread's setting back.
    with torch.autograd.set_multithreading_enabled(args.torch_backward_thread):
        history = []
        train_time = 0.0
        prev_time = time.perf_counter()
        for i in range(1, steps + 1):
            local, targets, net_ids = task.batch(batch_size)
            output = model(local) if args.tiles == 1 else model(local, net_ids)

            relative_l2_error = (output - targets.to(output.dtype)) ** 2 / (output.detach() ** 2 + 0.01)
            loss = relative_l2_error.mean()

            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            if i % log_every == 0 or i == steps:
                loss_val = loss.item()  # syncs
                tinn.runtime.sync()
                elapsed = time.perf_counter() - prev_time
                train_time += elapsed
                with torch.no_grad():
                    prediction = render()
                psnr = task.psnr(prediction)
                history.append({"step": i, "loss": loss_val, "psnr": psnr})
                print(f"Step#{i}: loss={loss_val:.6f} psnr={psnr:.2f}dB time={int(elapsed * 1e6)}[µs]")
                save_png(os.path.join(args.out, f"step_{i:06d}.png"), prediction)
                prev_time = time.perf_counter()  # ignore the time spent evaluating and saving

    with torch.no_grad():
        result = render()
    save_png(os.path.join(args.out, "result.png"), result)
    tcnn.free_temporary_memory()
    summary = {"arch": arch, "steps": steps, "batch": batch_size, "n_networks": task.n_networks,
               "sequential": args.sequential, "final_psnr": history[-1]["psnr"], "final_loss": history[-1]["loss"],
               "steps_per_second": steps / train_time if train_time > 0 else float("inf"), "history": history}
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"final PSNR {summary['final_psnr']:.2f} dB, {summary['steps_per_second']:.1f} steps/s; "
          f"images in {args.out}")
    return summary


if __name__ == "__main__":
    run()

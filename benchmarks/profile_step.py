"""Per-kernel time of one MLP-array training step (Taichi's kernel profiler).

    python -m benchmarks.profile_step [NETWORKS=1,4096] [LOG2_SAMPLES=22] [WIDTHS=64] [--json FILE] [--steps 5]

Even routing, 32 inputs, 16 outputs, 2 hidden layers, L2 loss, Adam. `--json` writes the mean milliseconds
per call of each kernel, per case.
"""
import argparse
import json
from importlib import import_module

import torch

import tinn  # noqa: E402
from tinn.backend import ti  # noqa: E402


def _records(prof):
    """(task name, mean ms per call) of every kernel task in the profiler's last printed statistics."""
    for name, stats in prof._statistical_results.items():
        yield name, stats.total_time / max(1, stats.counter)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("networks", nargs="?", default="1,4096")
    p.add_argument("log2_samples", nargs="?", type=int, default=22)
    p.add_argument("widths", nargs="?", default="64")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tinn.init(kernel_profiler=True)
    kernel_profiler = import_module(f"{ti.__name__}.profiler.kernel_profiler")  # Taichi's or Quadrants'
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    widths = [int(v) for v in args.widths.split(",")]
    cases = [(int(n), w) for n in args.networks.split(",") for w in widths]
    results = []
    for n, width in cases:
        batch = 1 << args.log2_samples
        net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam"})
        x = torch.rand(batch, 32, device=dev)
        y = torch.rand(batch, 16, device=dev)
        ids = (torch.arange(batch, device=dev) % n).to(torch.int32)
        with tinn.checks.disabled():
            for _ in range(3):
                trainer.training_step(x, y, ids)
            tinn.runtime.sync()
            ti.profiler.clear_kernel_profiler_info()
            for _ in range(args.steps):
                trainer.training_step(x, y, ids)
            tinn.runtime.sync()
        print(f"== N={n} width={width} batch={batch} ({args.steps} steps)")
        ti.profiler.print_kernel_profiler_info("count")
        results.append({"networks": n, "width": width, "log2_samples": args.log2_samples,
                        "kernel_ms": dict(_records(kernel_profiler.get_default_kernel_profiler()))})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

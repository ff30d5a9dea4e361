"""Host time of the image step per path, split into tinn's own Python and torch ops, and Taichi's launches.

Each path is timed twice on the same model and batch: as it is, and with every lean-launched Taichi
kernel replaced by a call that does nothing (`tinn/kernels/launch.py`'s FastKernel), so that what remains
is the Python and the torch ops that issue a step. No device sync inside a timed block, so on a GPU the
first column is the host time of a step (the GPU runs behind, as long as it keeps up) and the difference
between the columns is what the Taichi launches cost the host. On the CPU backend kernels run inside
their launch, so there only the no-op column is a host figure.

Paths: the native Trainer step; tcnn's sample loop through `tinn.torch` (module call, loss,
`zero_grad`, `backward`, `torch.optim.Adam` step) in parts: forward only, with loss and backward, whole.

    python -m benchmarks.tools.host_overhead [--arch cpu|cuda] [--log2-batch 16] [--config tinn/configs/config_hash.json]
"""
from __future__ import annotations

import argparse
import collections
import os

HERE = os.path.dirname(os.path.abspath(__file__))

import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402
from benchmarks.bench_torch_path import torch_adam  # noqa: E402
from benchmarks.common import host_ms_per_step, print_table, write_json  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="cpu")
    p.add_argument("--config", default=os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json"))
    p.add_argument("--log2-batch", type=int, default=None, help="default: 16 on a GPU, 8 on the CPU")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def paths(config: dict, batch: int) -> dict:
    from tinn.tasks.image import ImageTask, default_image
    task = ImageTask(default_image(64), tiles=1, seed=0)
    x, target, _ = task.batch(batch)
    trainer = tinn.Trainer.from_config(config, 2, 3, seed=1)
    model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=1)
    optimizer = torch_adam(model.parameters(), config.get("optimizer", {}))
    loss_fn = tinn.create_loss({"otype": "RelativeL2"})

    def native():
        trainer.training_step(x, target, None)

    def torch_forward():
        model(x)

    def torch_backward():
        loss = loss_fn(model(x), target)
        optimizer.zero_grad()
        loss.backward()

    def torch_step():
        torch_backward()
        optimizer.step()

    return {"Trainer step": native, "tinn.torch forward": torch_forward,
            "tinn.torch forward, loss, backward": torch_backward, "tinn.torch step with torch Adam": torch_step}


def main(argv=None) -> dict:
    args = parse_args(argv)
    arch = tinn.init(args.arch)
    with tinn.checks.disabled():
        batch = 1 << (args.log2_batch or (16 if arch == "cuda" else 8))
        config = tinn.load_config(args.config)
        runs = paths(config, batch)
        for fn in runs.values():  # compile every kernel instance and keep it for the lean launch
            for _ in range(3):
                fn()
        tinn.runtime.sync()
        from tinn.kernels import launch
        real_call = launch.FastKernel.__call__
        launches = collections.Counter()

        def no_op(self, *args):
            launches[self.__name__] += 1

        rows = []
        for name, fn in runs.items():
            row = {"path": name, "host_us": 1e3 * host_ms_per_step(fn, bursts=args.reps, steps=args.steps)}
            launch.FastKernel.__call__ = no_op
            launches.clear()
            try:
                row["no_kernels_us"] = 1e3 * host_ms_per_step(fn, bursts=args.reps, steps=args.steps)
            finally:
                launch.FastKernel.__call__ = real_call
            row["launches"] = sum(launches.values()) / (args.steps * args.reps)
            row["launch_us"] = row["host_us"] - row["no_kernels_us"]
            rows.append(row)
        print(f"host time per step, {arch}, {os.path.basename(args.config)}, batch 2^{batch.bit_length() - 1}"
              + ("" if arch == "cuda"
                 else " (CPU: kernels run inside their launches, so only the no-op column is host time)"))
        print_table(rows, [("path", "path", "s"), ("host_us", "as is us", ".1f"),
                           ("no_kernels_us", "kernels no-op us", ".1f"), ("launches", "launches", ".0f"),
                           ("launch_us", "launch share us", ".1f")])
        payload = {"benchmark": "host_overhead", "arch": arch, "batch": batch, "rows": rows}
        write_json(args.json, payload)
        return payload


if __name__ == "__main__":
    main()

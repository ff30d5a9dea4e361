"""Cost of the PyTorch path against the native Trainer path, per training step.

Both train the same model (same config, seed, batches) on learning-an-image data:

* native:    `tinn.Trainer` — NetworkWithInputEncoding, the fused loss kernel (value and dL/dy in one
             launch), hand-written backward, tinn's Adam kernel.
* pytorch:   `tinn.torch.NetworkWithInputEncoding` + relative L2 written in torch (tcnn's sample) +
             `torch.optim.Adam` (same hyper-parameters as the config's Adam, l2_reg aside).
* pt+loss:   the PyTorch path with tinn's differentiable loss (`tinn.create_loss(...)(pred, target)`)
             instead of the torch formula: separates the loss's share of the overhead from the optimizer's.

    python -m benchmarks.bench_torch_path                           # GPU: batch 2^16, 2^18; CPU: 2^12, 2^14
    python -m benchmarks.bench_torch_path --log2-batch 16,18 --networks 1,64 --json out.json
    python -m benchmarks.bench_torch_path --config tinn/configs/config_hash.json

Times are medians over `--reps` timed blocks of `--steps` steps each, with a device sync around every
block (not inside it). The sync-costing input checks (NaN scan, net-id range) are off for both paths by
default, as in a trusted training loop; `--sync-checks` turns them on.
"""
from __future__ import annotations

import argparse
import contextlib
import os

import torch


import tinn  # noqa: E402
import tinn.torch as tcnn  # noqa: E402
from benchmarks.common import print_table, time_fn, write_json  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "tinn", "configs", "config.json"))
    p.add_argument("--log2-batch", default=None, help="comma-separated log2 batch sizes (default: 16,18 GPU / 12,14 CPU)")
    p.add_argument("--networks", default="1", help="comma-separated network counts (tiles of the image: 1, 4, 16, 64, ...)")
    p.add_argument("--steps", type=int, default=None, help="steps per timed block (default: 20 GPU / 3 CPU)")
    p.add_argument("--reps", type=int, default=None, help="timed blocks (default: 5 GPU / 3 CPU)")
    p.add_argument("--sync-checks", action="store_true", help="keep the input checks that sync (NaN scan, id range)")
    p.add_argument("--arch", default=None)
    p.add_argument("--json", default=None, help="write the results here")
    return p.parse_args(argv)


def relative_l2(output, targets):
    """tcnn's sample: relative L2 with the denominator outside the gradient."""
    return ((output - targets) ** 2 / (output.detach() ** 2 + 0.01)).mean()


def torch_adam(params, cfg: dict, **options) -> torch.optim.Adam:
    """torch's Adam with the config's hyper-parameters; `options` go to torch (e.g. fused=True)."""
    return torch.optim.Adam(params, lr=cfg.get("learning_rate", 1e-3), betas=(cfg.get("beta1", 0.9), cfg.get("beta2", 0.999)),
                            eps=cfg.get("epsilon", 1e-8), **options)


def on_calling_thread(fn):
    """`fn` with torch's autograd running its backward on the calling thread instead of torch's device thread."""
    def run():
        with torch.autograd.set_multithreading_enabled(False):
            return fn()
    return run


class ImageSteps:
    """The image step (config's encoding and network, one network) both ways, on a few fixed batches taken in
    turn, for the host-time tools: `native()` is a Trainer step, `torch_loop(...)` tcnn's sample loop through
    `tinn.torch` (module call, loss, zero_grad, backward, optimizer step)."""

    def __init__(self, config: dict, log2_batch: int, n_batches: int = 4, seed: int = 1337):
        from tinn.tasks.image import ImageTask, default_image
        task = ImageTask(default_image(256), seed=0)
        self.config = config
        self.batches = [task.batch(1 << log2_batch) for _ in range(n_batches)]
        self.trainer = tinn.Trainer.from_config(config, 2, 3, seed=seed)
        self.model = self.tcnn_model(seed)
        self.i = 0

    def tcnn_model(self, seed: int = 1337):
        return tcnn.NetworkWithInputEncoding(2, 3, self.config["encoding"], self.config["network"], seed=seed)

    def next_batch(self):
        self.i = (self.i + 1) % len(self.batches)
        return self.batches[self.i]

    def native(self) -> None:
        x, t, _ = self.next_batch()
        self.trainer.training_step(x, t)

    def torch_loop(self, optimizer, loss_fn=relative_l2, model=None, backward=None, step=None):
        """One step of tcnn's loop as a function; `backward(loss)` and `step()` replace `loss.backward()` and
        `optimizer.step()` where given (e.g. timed versions)."""
        model = model or self.model

        def run():
            x, t, _ = self.next_batch()
            loss = loss_fn(model(x), t)
            optimizer.zero_grad()
            (backward or torch.Tensor.backward)(loss)
            (step or optimizer.step)()
        return run

    def captured_loop(self, optimizer, loss_fn=relative_l2, warmup: int = 3):
        """tcnn's loop captured by the caller as one CUDA graph (`torch.cuda.graph`, PyTorch's recipe for a loop
        bound by the host; `optimizer` must be `capturable`): `warmup` steps op by op on a side stream, one capture,
        then each step copies the next batch into the graph's inputs and replays it."""
        x0, t0, _ = self.next_batch()
        x, t = x0.clone(), t0.clone()

        def step():
            loss = loss_fn(self.model(x), t)
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()

        def run():
            xb, tb, _ = self.next_batch()
            x.copy_(xb)
            t.copy_(tb)
            graph.replay()
        return run


def bench_one(config: dict, batch: int, n_networks: int, steps: int, reps: int, seed: int = 1337) -> dict:
    from tinn.tasks.image import ImageTask, default_image

    tiles = int(round(n_networks ** 0.5))
    if tiles * tiles != n_networks:
        raise SystemExit(f"--networks {n_networks}: must be a square (one network per image tile)")
    task = ImageTask(default_image(256), tiles=tiles, seed=0)
    batches = [task.batch(batch) for _ in range(4)]  # made up front: data generation is not timed
    ids_or_none = (lambda ids: ids) if n_networks > 1 else (lambda ids: None)

    trainer = tinn.Trainer.from_config(config, 2, 3, n_networks=n_networks, seed=seed)
    model = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=seed, n_networks=n_networks)
    opt_cfg = config.get("optimizer", {})
    if opt_cfg.get("otype", "Adam") != "Adam":
        opt_cfg = {}
    optimizer = torch_adam(model.parameters(), opt_cfg)
    model2 = tcnn.NetworkWithInputEncoding(2, 3, config["encoding"], config["network"], seed=seed, n_networks=n_networks)
    optimizer2 = torch_adam(model2.parameters(), opt_cfg)
    tinn_loss = tinn.create_loss({"otype": "RelativeL2"})
    state = {"i": 0, "loss": {}}

    def next_batch():
        state["i"] = (state["i"] + 1) % len(batches)
        return batches[state["i"]]

    def native_step():
        x, t, ids = next_batch()
        state["loss"]["native"] = trainer.training_step(x, t, ids_or_none(ids))

    def pytorch_step():
        x, t, ids = next_batch()
        loss = relative_l2(model(x, ids_or_none(ids)), t)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state["loss"]["pytorch"] = loss.detach()

    def pytorch_tinn_loss_step():
        x, t, ids = next_batch()
        loss = tinn_loss(model2(x, ids_or_none(ids)), t)
        optimizer2.zero_grad()
        loss.backward()
        optimizer2.step()
        state["loss"]["pt+loss"] = loss.detach()

    row = {"batch": batch, "n_networks": n_networks}
    for key, fn in (("native", native_step), ("pytorch", pytorch_step), ("pt+loss", pytorch_tinn_loss_step)):
        seconds = time_fn(lambda: [fn() for _ in range(steps)], warmup=1, reps=reps)
        row[f"{key}_ms"] = 1e3 * seconds / steps
        row[f"{key}_loss"] = float(state["loss"][key])
    row["overhead_ms"] = row["pytorch_ms"] - row["native_ms"]
    row["overhead_pct"] = 100.0 * row["overhead_ms"] / row["native_ms"]
    row["pt+loss_overhead_pct"] = 100.0 * (row["pt+loss_ms"] - row["native_ms"]) / row["native_ms"]
    return row


def main(argv=None) -> dict:
    args = parse_args(argv)
    arch = tinn.init(args.arch)
    on_gpu = arch == "cuda"
    log2s = [int(v) for v in (args.log2_batch or ("16,18" if on_gpu else "12,14")).split(",")]
    networks = [int(v) for v in args.networks.split(",")]
    steps = args.steps or (20 if on_gpu else 3)
    reps = args.reps or (5 if on_gpu else 3)
    config = tinn.load_config(args.config)
    device = torch.cuda.get_device_name(0) if on_gpu else "cpu"
    print(f"tinn {tinn.__version__} on {arch} ({device}), config {os.path.basename(args.config)}, "
          f"{steps} steps x {reps} reps per point, sync checks {'on' if args.sync_checks else 'off'}")
    rows = []
    # The checks' switch is process-wide: restored afterwards, so a caller in the same process (the harness, a
    # test) keeps its own.
    with contextlib.nullcontext() if args.sync_checks else tinn.checks.disabled():
        for n in networks:
            for lg in log2s:
                rows.append(bench_one(config, 1 << lg, n, steps, reps))
                rows[-1]["log2_batch"] = lg
    print_table(rows, [("n_networks", "nets", "d"), ("log2_batch", "log2 batch", "d"),
                       ("native_ms", "native ms/step", ".3f"), ("pytorch_ms", "pytorch ms/step", ".3f"),
                       ("overhead_ms", "overhead ms", "+.3f"), ("overhead_pct", "overhead %", "+.1f"),
                       ("pt+loss_ms", "pt+tinn-loss ms", ".3f"), ("pt+loss_overhead_pct", "pt+tinn-loss %", "+.1f")])
    payload = {"benchmark": "torch_path", "arch": arch, "device": device, "config": os.path.basename(args.config),
               "steps": steps, "reps": reps, "sync_checks": args.sync_checks, "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()

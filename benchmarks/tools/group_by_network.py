"""An encoded array's training step with its batch grouped by network id and in the caller's order, same process.

    python -m benchmarks.tools.group_by_network [--rounds 3] [--steps 20] [--json out/group_by_network.json]

`NetworkWithInputEncoding` runs an array whose networks own hash grids on its batch grouped by network id
(`tuning.group_by_network`, on by default on CUDA). Each case times the `Trainer`'s step (L2 loss, Adam) with
grouping off and on, alternating for `--rounds` rounds (steps issued back to back, one sync per block of
`--steps`), the Trainer's contract step and the same step through torch autograd (`--autograd`), and prints
the medians, their ratio and the first step's loss both ways:

  octree   9 networks (an octree's root and 8 leaves): a 16-level grid of 2^16 entries per node and a 32-wide
           MLP to 4 outputs, as tools/octree_quality.py builds them; 2^20 samples in runs of 8-64 along random
           rays (a ray's samples in one node, as an octree step assigns them)
  random   the same model, ids and positions uniform at random
  array    4096 networks, benchmarks/bench_sharded.py's scaling grid (8 levels of 2^13) and 2 x 64 MLP to 16
           outputs, 2^22 samples, ids and positions uniform at random
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import tinn
from benchmarks.common import print_table, settings_installed, time_pipelined_blocks, write_json

OCTREE_GRID = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 16,
               "base_resolution": 16, "per_level_scale": 1.4}
OCTREE_MLP = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None", "n_neurons": 32,
              "n_hidden_layers": 1}
SCALING_GRID = {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 13,
                "base_resolution": 4, "per_level_scale": 1.5}
SCALING_MLP = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU",
               "output_activation": "None"}


def ray_runs(batch: int, n_networks: int, gen: torch.Generator, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions in [0, 1)^3, ids): runs of 8-64 samples along random rays, each run in one network."""
    lengths = torch.randint(8, 65, (batch // 8,), generator=gen, device=dev)
    first = torch.cumsum(lengths, 0) - lengths
    run = torch.repeat_interleave(torch.arange(lengths.shape[0], device=dev), lengths)[:batch]
    step = (torch.arange(batch, device=dev) - first[run]).float()
    origin = torch.rand(lengths.shape[0], 3, generator=gen, device=dev)
    direction = torch.nn.functional.normalize(torch.randn(lengths.shape[0], 3, generator=gen, device=dev), dim=1)
    x = (origin[run] + 0.004 * step[:, None] * direction[run]).remainder(1.0)
    ids = torch.randint(0, n_networks, (lengths.shape[0],), generator=gen, device=dev, dtype=torch.int32)[run]
    return x.contiguous(), ids.contiguous()


def case(name: str, dev):
    gen = torch.Generator(device=dev).manual_seed(0)
    if name == "array":
        n, batch, grid, mlp, n_out = 4096, 1 << 22, SCALING_GRID, SCALING_MLP, 16
        x = torch.rand(batch, 3, generator=gen, device=dev)
        ids = torch.randint(0, n, (batch,), generator=gen, device=dev, dtype=torch.int32)
    else:
        n, batch, grid, mlp, n_out = 9, 1 << 20, OCTREE_GRID, OCTREE_MLP, 4
        if name == "octree":
            x, ids = ray_runs(batch, n, gen, dev)
        else:
            x = torch.rand(batch, 3, generator=gen, device=dev)
            ids = torch.randint(0, n, (batch,), generator=gen, device=dev, dtype=torch.int32)
    target = torch.rand(batch, n_out, generator=gen, device=dev)
    return n, grid, mlp, n_out, x, ids, target


def measure(name: str, rounds: int, steps: int, autograd: bool, dev) -> dict:
    from tinn.models import NetworkWithInputEncoding
    n, grid, mlp, n_out, x, ids, target = case(name, dev)
    steps_of, first_loss = {}, {}
    for grouped in (False, True):
        chosen = tinn.settings.installed().replace(group_by_network=grouped)
        with settings_installed(chosen):
            model = NetworkWithInputEncoding(3, n_out, grid, mlp, n_networks=n, seed=3)
            trainer = tinn.Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
            if autograd:  # module call, torch loss, backward through autograd, the Trainer's optimizer
                def step(model=model, trainer=trainer):
                    return trainer.optimize(lambda: ((model(x, ids) - target) ** 2).mean())
            else:
                def step(trainer=trainer):
                    return trainer.training_step(x, target, ids)
            with tinn.checks.disabled():
                first_loss[grouped] = float(step())
        steps_of[grouped] = (chosen, step)
    times = {False: [], True: []}
    for _ in range(rounds):
        for grouped in (False, True):
            chosen, step = steps_of[grouped]
            with settings_installed(chosen), tinn.checks.disabled():
                times[grouped] += time_pipelined_blocks(step, warmup=3, steps=steps, blocks=1)
    plain, grouped = (statistics.median(times[g]) * 1e3 for g in (False, True))
    return {"case": name + (" (autograd)" if autograd else ""), "networks": n, "batch": x.shape[0],
            "caller_order_ms": plain, "grouped_ms": grouped,
            "speedup": plain / grouped, "first_loss_caller_order": first_loss[False],
            "first_loss_grouped": first_loss[True], "blocks": {str(k): v for k, v in times.items()}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="octree,random,array")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--autograd", default="0,1", help="1: the step through torch autograd (module call, torch loss, "
                   "backward), 0: the Trainer's contract step (comma list)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("group_by_network.py times CUDA steps")
    dev = tinn.runtime.device()
    rows = [measure(name, args.rounds, args.steps, bool(int(a)), dev) for name in args.cases.split(",")
            for a in args.autograd.split(",")]
    print_table(rows, [("case", "case", "s"), ("networks", "networks", "d"), ("batch", "samples", "d"),
                       ("caller_order_ms", "caller's order ms", ".3f"), ("grouped_ms", "grouped ms", ".3f"),
                       ("speedup", "x", ".2f"), ("first_loss_caller_order", "loss (caller's order)", ".6f"),
                       ("first_loss_grouped", "loss (grouped)", ".6f")])
    write_json(args.json, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()

"""What `Settings.deterministic` costs, and whether each mode repeats itself, for the same training steps.

    python -m benchmarks.bench_deterministic [--log2-samples 20] [--json out.json]

Cases (one `Trainer.training_step`, L2 loss, Adam): an MLP array (64 networks, 64 wide, 32 in, 16 out, 2 hidden
layers) and 64 networks of a hash grid (16 levels, 2^15 entries) feeding an MLP, both with ragged routing.
Per case and mode: median step time, peak memory, and whether three fresh runs of a few steps from the same
seed gave bit-identical losses and parameters. Prints a table and writes JSON.
"""
import argparse


import torch  # noqa: E402

import tinn  # noqa: E402

NET = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU",
       "output_activation": "None"}
GRID = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 15,
        "base_resolution": 16, "per_level_scale": 1.5}
N_NETWORKS = 64


def main(argv=None):
    from benchmarks.common import peak_memory_mib, peak_memory_reset, print_table, time_fn, write_json
    from tinn import settings
    from tinn.models import NetworkWithInputEncoding
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log2-samples", type=int, default=None, help="default: 20 on a GPU, 14 on the CPU")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--repeat-steps", type=int, default=5, help="steps per run of the repeatability check")
    p.add_argument("--json", default=None)
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    dev = tinn.runtime.device()
    batch = 1 << (args.log2_samples or (20 if arch == "cuda" else 14))
    gen = torch.Generator().manual_seed(0)
    weights = torch.rand(N_NETWORKS, generator=gen) ** 4        # ragged: a few networks take most samples
    ids = torch.multinomial(weights, batch, replacement=True, generator=gen).int().to(dev)
    models = {
        "MLP array, 32 -> 64 x 2 -> 16": (32, lambda: NetworkArray(32, 16, NET, n_networks=N_NETWORKS, seed=3)),
        "hash grid 16 x 2^15 per network + MLP": (3, lambda: NetworkWithInputEncoding(3, 16, GRID, NET,
                                                                                n_networks=N_NETWORKS, seed=3)),
    }
    original = settings.installed()
    rows = []
    for case, (n_in, make) in models.items():
        x = torch.rand(batch, n_in, generator=gen).to(dev)
        t = torch.rand(batch, 16, generator=gen).to(dev)
        for deterministic in (False, True):
            settings.install(original.replace(deterministic=deterministic))

            def run(steps):
                model = make()
                trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
                losses = [float(trainer.training_step(x, t, ids)) for _ in range(steps)]
                return losses, torch.cat([q.detach().flatten() for q in model.parameters()]).cpu()

            first = run(args.repeat_steps)
            repeats = [run(args.repeat_steps) for _ in range(2)]
            identical = all(r[0] == first[0] and torch.equal(r[1], first[1]) for r in repeats)
            max_diff = max(float((r[1] - first[1]).abs().max()) for r in repeats)
            model = make()
            trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
            trainer.training_step(x, t, ids)
            peak_memory_reset()
            ms = 1e3 * time_fn(lambda: trainer.training_step(x, t, ids), reps=args.reps)
            rows.append({"case": case, "mode": "deterministic" if deterministic else "default", "ms": ms,
                         "mib": peak_memory_mib(), "bit_identical": identical, "max_param_diff": max_diff})
            del model, trainer
    settings.install(original)
    for r in rows:
        base = next(b for b in rows if b["case"] == r["case"] and b["mode"] == "default")
        r["cost"] = r["ms"] / base["ms"]
    device = torch.cuda.get_device_name(0) if arch == "cuda" else "cpu"
    print(f"\ndeterministic mode against the default, training step, {batch} samples, ragged over "
          f"{N_NETWORKS} networks, {device}")
    print_table(rows, [("case", "case", "s"), ("mode", "mode", "s"), ("ms", "ms / step", ".2f"),
                       ("cost", "x default", ".2f"), ("mib", "peak MiB", ".0f"),
                       ("bit_identical", "3 runs bit-identical", ""), ("max_param_diff", "max param diff", ".1e")])
    write_json(args.json, {"device": device, "batch": batch, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

"""Arrays past 2^31 parameters on one GPU: train them, compare with a finer chunking, time the chunking.

    python -m benchmarks.tools.big_array_check --json out/big_array_check.json

Cases (each trained a few Adam steps on fixed random data, then freed):
- grids: 170 3D hash grids of tcnn's usual size (16 levels, 2^19 entries, 2 features, base resolution 16,
  per-level scale 1.5: 13.06M floats each, 2.22G in all) with a 64-wide MLP per grid; before row chunks
  Taichi's 32-bit indices crashed from 165 such grids on.
- mlps: 65,537 networks of 128 in / 128 wide / 128 out (32,768 weights each, 2^31 + 32,768 in all).
Each case runs twice from the same seed and data: with the default chunk limit (2^30 elements) and with a
limit of 2^28 elements (9 chunks); losses and final parameters must agree to float tolerance (the
gradient sums use atomics, whose order differs). Then the chunking cost: the 4096 x 64 target step
(2^22 samples) with one launch per kernel and with the table cut in 4 chunks.
Peak memory stays near 45 GB (parameters, gradients and Adam state of one case at a time).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time


import torch  # noqa: E402

import tinn  # noqa: E402
from tinn import chunks, settings  # noqa: E402

FINE_LIMIT = 1 << 28


def set_limit(limit: int) -> None:
    settings.install(settings.installed().replace(table_chunk_elements=limit))


def grid_model(n):
    from tinn.models import NetworkWithInputEncoding
    enc = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 19,
           "base_resolution": 16, "per_level_scale": 1.5}
    net = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 1}
    return NetworkWithInputEncoding(3, 1, enc, net, n_networks=n, seed=7)


def mlp_model(n):
    from tinn.networks import NetworkArray
    return NetworkArray(128, 128, {"otype": "FullyFusedMLP", "n_neurons": 128, "n_hidden_layers": 1},
                        n_networks=n, seed=7)


def data(n, n_in, n_out, batch, seed=0):
    dev = tinn.runtime.device()
    gen = torch.Generator(device=dev).manual_seed(seed)
    x = torch.rand(batch, n_in, device=dev, generator=gen)
    ids = torch.randint(0, n, (batch,), device=dev, generator=gen, dtype=torch.int32)
    target = torch.sin(6 * x[:, :n_out]) if n_out <= n_in else torch.rand(batch, n_out, device=dev, generator=gen)
    return x, target, ids


def train(make, n, n_in, n_out, batch, steps, limit):
    from tinn.trainer import Trainer
    set_limit(limit)
    gc.collect()  # the previous case's trainer holds reference cycles: free its tables before drawing new ones
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model = make(n)
    build_s = time.perf_counter() - t0
    trainer = Trainer(model, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-2})
    x, target, ids = data(n, n_in, n_out, batch)
    losses, times = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(float(trainer.training_step(x, target, ids)))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tables = [p.detach().cpu() for p in model.parameters()]
    table = max((p for p in model.parameters()), key=lambda p: p.numel())
    spans = len(chunks.row_spans(table.shape[0], table.shape[1]))
    out = {"losses": losses, "step_ms": 1e3 * min(times[1:] or times), "build_s": build_s, "chunks": spans,
           "table_elements": table.numel(), "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del trainer, model, x, target, ids, table
    gc.collect()
    torch.cuda.empty_cache()
    return out, tables


def max_rel_diff(a_list, b_list) -> float:
    worst = 0.0
    for a, b in zip(a_list, b_list):
        for lo in range(0, a.shape[0], 8):  # row blocks: no temporaries of the table's size
            d = (a[lo:lo + 8] - b[lo:lo + 8]).abs().max().item()
            worst = max(worst, d / max(a[lo:lo + 8].abs().max().item(), 1e-30))
    return worst


def check_case(name, make, n, n_in, n_out, batch, steps):
    default = settings.Tuning().table_chunk_elements
    one, tables_a = train(make, n, n_in, n_out, batch, steps, default)
    fine, tables_b = train(make, n, n_in, n_out, batch, steps, FINE_LIMIT)
    loss_diff = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(one["losses"], fine["losses"]))
    param_diff = max_rel_diff(tables_a, tables_b)
    ok = loss_diff < 1e-4 and param_diff < 1e-3 and one["losses"][-1] < one["losses"][0]
    return {"case": name, "networks": n, "table_elements": one["table_elements"],
            "past_2_31": one["table_elements"] > 2**31 - 1, "chunks_default": one["chunks"],
            "chunks_fine": fine["chunks"], "step_ms_default": one["step_ms"], "step_ms_fine": fine["step_ms"],
            "peak_gib": max(one["peak_gib"], fine["peak_gib"]), "losses": one["losses"],
            "losses_fine": fine["losses"], "max_rel_loss_diff": loss_diff, "max_rel_param_diff": param_diff,
            "ok": ok}


def chunking_cost(reps: int):
    """The 4096 x 64 target training step, one launch per kernel against the table in 4 chunks."""
    from benchmarks.common import time_fn
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer
    cfg = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2}
    rows = {}
    for label, parts in (("one launch", 1), ("4 chunks", 4)):
        net = NetworkArray(32, 16, cfg, n_networks=4096, seed=1)
        set_limit(settings.Tuning().table_chunk_elements if parts == 1 else net.params.numel() // parts)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-3})
        x, target, ids = data(4096, 32, 16, 1 << 22)
        ids = (torch.arange(1 << 22, device=x.device) % 4096)[torch.randperm(1 << 22, device=x.device)].int()
        with tinn.checks.disabled():
            rows[label] = 1e3 * time_fn(lambda: trainer.training_step(x, target, ids), reps=reps)
        del trainer, net
        gc.collect()
    set_limit(settings.Tuning().table_chunk_elements)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default="out/big_array_check.json")
    p.add_argument("--cases", default="grids,mlps,cost")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    tinn.init("cuda")
    cases = args.cases.split(",")
    results = {"device": torch.cuda.get_device_name(0), "fine_limit": FINE_LIMIT, "cases": []}
    t0 = time.perf_counter()
    if "grids" in cases:
        results["cases"].append(check_case("170 hash grids (2^19 x 16) + MLPs", grid_model, 170, 3, 1,
                                           1 << 20, args.steps))
    if "mlps" in cases:
        results["cases"].append(check_case("65537 MLPs 128x128x128", mlp_model, 65537, 128, 128, 1 << 20,
                                           args.steps))
    if "cost" in cases:
        results["chunking_cost_ms"] = chunking_cost(args.reps)
    results["seconds"] = time.perf_counter() - t0

    print(f"{'case':40} {'elements':>12} {'chunks':>7} {'step ms':>9} {'fine ms':>9} {'peak GiB':>9} "
          f"{'loss diff':>10} {'param diff':>10}  ok")
    for r in results["cases"]:
        print(f"{r['case']:40} {r['table_elements']:>12} {r['chunks_default']:>3}/{r['chunks_fine']:<3} "
              f"{r['step_ms_default']:>9.2f} {r['step_ms_fine']:>9.2f} {r['peak_gib']:>9.1f} "
              f"{r['max_rel_loss_diff']:>10.2e} {r['max_rel_param_diff']:>10.2e}  {r['ok']}")
        print(f"  losses {['%.5f' % v for v in r['losses']]}")
    if "chunking_cost_ms" in results:
        print("4096 x 64 target step (2^22 samples, even):",
              ", ".join(f"{k} {v:.2f} ms" for k, v in results["chunking_cost_ms"].items()))
    print(f"total {results['seconds']:.0f} s")
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())

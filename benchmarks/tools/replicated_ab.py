"""A data-parallel array's step under several tunings, alternated in rounds inside one run so that every variant
meets the same machine state; the one-GPU step of the same array is timed in the same run.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m benchmarks.tools.replicated_ab \
        --batches 4194304,16777216 --variants "reduce_pieces=1;reduce_pieces=4" --out out/replicated_ab.json

A variant is a set of tuning fields in the TINN_SETTINGS form (`name=value,name=value`; "" for the defaults), such
as `tuning.reduce_pieces` (the all-reduce cut by network) or `tuning.replicated_step_graphs` (steps replayed from
CUDA graphs with their collectives). The array is the MLP-only (or --model grid) array of
benchmarks/bench_sharded.py, float16 tensor cores, in a `td.Replicated` part with the all-reduce and the whole
optimizer on every rank (--split on: its optimizer split over the ranks). For each global batch B: the one-GPU step
at B and at B / world (rank 0 alone; "same array" weak scaling compares the latter with the two-GPU step), then one
Trainer per variant, each stepped under its own tuning, `--rounds` rounds of every variant, `--reps` timed steps
each. Rank 0 prints the medians and writes them, with every round's time, as JSON.
"""
from __future__ import annotations

import argparse
import statistics

import tinn.distributed as td
from benchmarks import bench_sharded as bs


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _variants(text: str) -> dict[str, dict]:
    """`--variants` as {its text: its tuning fields}, checked (a ConfigError names a bad field or value)."""
    from tinn import settings

    out = {}
    for item in text.split(";"):
        fields = settings.parse(item)
        settings.installed().replace(**fields)
        out[item.strip()] = fields
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path (written by rank 0)")
    p.add_argument("--batches", default=str(1 << 22), help="global batches, comma-separated")
    p.add_argument("--variants", default="reduce_pieces=1;reduce_pieces=4",
                   help="tunings alternated in each round, separated by ';' (each name=value,name=value)")
    p.add_argument("--networks", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=20, help="timed steps per variant and round")
    p.add_argument("--model", default="mlp", choices=("mlp", "grid"))
    p.add_argument("--split", default="off", choices=("on", "off"), help="the optimizer split over the ranks")
    args = p.parse_args()
    batches = _ints(args.batches)
    if not batches or min(batches) < 1 or args.rounds < 1 or args.reps < 1:
        p.error("--batches takes positive integers, comma-separated; --rounds and --reps at least 1")
    from tinn.errors import ConfigError
    try:
        variants = _variants(args.variants)
    except ConfigError as e:
        p.error(f"--variants: {e}")
    td.init()
    from tinn import checks, settings
    from tinn.trainer import Trainer

    from benchmarks.common import settle, time_pipelined_blocks, write_json

    world, rank = td.world_size(), td.rank()
    build, dims = bs.scaling_model(args.model, bs.SCALING_GRID, "float16")
    adam = {"otype": "Adam", "learning_rate": 1e-3}
    base = settings.installed()
    results = []
    for batch in batches:
        one = {}
        if rank == 0:
            trainer = Trainer(build(args.networks), optimizer=adam)
            for b in sorted({batch, batch // world}):
                loop = bs.step_loop(trainer, *bs.synthetic_batch(b, dims, args.networks, 1))
                with checks.disabled():
                    settle(lambda: loop(1))
                    one[b] = 1e3 * min(time_pipelined_blocks(lambda: loop(1), 0, args.reps, args.rounds))
            trainer = loop = None
        bs.free_memory()
        bs.barrier()
        data = bs.synthetic_batch(batch // world, dims, args.networks, 2 + rank)
        trainers, loops, rounds = {}, {}, {v: [] for v in variants}
        with checks.disabled():
            for v, fields in variants.items():  # each variant's trainer, its compilation and capture before timing
                settings.install(base.replace(**fields))
                trainers[v] = Trainer(td.Replicated(build(args.networks), optimizer_split=args.split == "on"),
                                      optimizer=adam)
                loops[v] = bs.step_loop(trainers[v], *data)
                settle(lambda: loops[v](1))
            for _ in range(args.rounds):
                for v, fields in variants.items():
                    settings.install(base.replace(**fields))
                    (seconds,) = time_pipelined_blocks(lambda: loops[v](1), 2, args.reps, 1)
                    rounds[v].append(1e3 * bs.max_over_ranks(seconds))
        status = {v: t.step_graph_status for v, t in trainers.items()}
        settings.install(base)
        trainers = loops = data = None
        bs.free_memory()
        one = bs.gather_objects(one)[0]
        median = {k: statistics.median(v) for k, v in rounds.items()}
        results.append({"batch": batch, "one_gpu_ms": one[batch], "one_gpu_half_ms": one[batch // world],
                        "two_gpu_ms": median, "rounds_ms": rounds, "step_graphs": status,
                        "strong": {k: one[batch] / v for k, v in median.items()},
                        "same_array_weak": {k: one[batch // world] / v for k, v in median.items()}})
    if rank == 0:
        record = {"world": world, "model": args.model, "networks": args.networks, "split": args.split == "on",
                  "rounds": args.rounds, "reps": args.reps, "results": results}
        write_json(args.out, record)
        width = max(len("variant"), *(len(v) for v in variants))
        print(f"{'global batch':>13}{'1 GPU ms':>10}  {'variant':<{width}}{'2 GPUs ms':>11}{'strong':>8}"
              f"{'same array':>12}  rounds ms")
        for r in results:
            for v, ms in r["two_gpu_ms"].items():
                spread = " ".join(f"{t:.3f}" for t in r["rounds_ms"][v])
                print(f"{r['batch']:>13}{r['one_gpu_ms']:>10.3f}  {v:<{width}}{ms:>11.3f}{r['strong'][v]:>7.2f}x"
                      f"{r['same_array_weak'][v]:>12.2f}  {spread}")
    td.shutdown()


if __name__ == "__main__":
    main()

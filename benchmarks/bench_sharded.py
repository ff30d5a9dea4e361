"""Sharded network arrays over GPUs: strong scaling, weak scaling, a per-step profile, and a model larger than
one GPU.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m benchmarks.bench_sharded --out sharded.json
    TINN_ARCH=cpu torchrun --nproc_per_node 2 -m benchmarks.bench_sharded --tiny --out /tmp/sharded.json  # CPU check

One process per GPU; `tinn.distributed.init()` pins each rank to its GPU (LOCAL_RANK) before Taichi starts.
One command measures one GPU and all of them: the one-GPU runs happen on rank 0 while the others wait.

1. Strong scaling: one model (N networks) trained with a global batch B. Rank 0 alone runs the unsharded array
   on B samples (the other ranks wait), then the sharded array runs on every rank with B / world samples each.
   Ratio = time(1 GPU) / time(world GPUs); target >= 1.85 on 2 GPUs.
2. Weak scaling: world x N networks, B samples per rank. Per-GPU throughput relative to the 1-GPU run;
   target >= 0.93. Replicated runs also report data parallelism's own weak scaling ("same N"): the same N
   networks on every rank, B samples per rank.
   Models (--models): "grid", each network a hash grid + a 64-wide MLP (3 in, 4 out); "mlp", an MLP-only
   array (32 in, two hidden layers of 64, 16 out). Precisions (--precisions, --grid-precisions): "float32"
   (the float32 kernels, named: CUDA arrays default to float16) and "float16" (the tensor-core kernels). --chunks / --grid-chunks: the sharded
   part's pipelining.
   Strategies (--strategies): "sharded" (a ShardedPart: each rank owns N / world networks, samples travel
   to their owners, in each of --exchange-dtypes) and "replicated" (data parallel: every rank holds the whole
   array in a Replicated part, computes its own samples, and the gradients are reduced, in each of
   --reduce-dtypes; with each of --optimizer-splits: "on", the optimizer split over the ranks, gradients
   reduce-scattered and parameters all-gathered in float32; "off", an all-reduce and the whole optimizer on
   every rank), the latter for the models in --replicated-models. Both scale the same way: strong, N networks
   and B / world samples per rank; weak, world x N networks and B samples per rank.
   Each multi-GPU run is then profiled (--profile-steps steps, after warm-up steps): per step, the time the
   compute stream spent in the exchange, the local part's compute, the gradients' reduction (replicated
   tables of a sharded part, every table of a replicated one; with the split optimizer its reduce-scatter
   and all-gather), idle (the header's host round trip), the optimizer's update and other (loss), from CUDA
   events (tinn/distributed/profile.py).
   A sharded run with a 16-bit exchange also reports how far its outputs and gradients on one batch lie from
   the float32 exchange's (the same networks, the same samples).
3. A field too big for one GPU: a KiloNeRF-style grid of cells over the procedural scene, every cell a
   tcnn-sized hash grid (16 levels x 2 features, 2^19 entries) + MLP; the cells are split into several arrays
   (z slabs), each a ShardedPart, so that every table stays below 2^31 floats. Trained on the analytic
   scene's density and colour at random points (the KiloNeRF distillation loss), then held-out views are
   rendered through the sharded field and compared with ground-truth renders (PSNR).

Prints a table last and writes JSON (rank 0).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time


import torch  # noqa: E402

import tinn.distributed as td  # noqa: E402
from tinn.distributed.strategy import REDUCE_BYTES  # noqa: E402

MAX_TABLE = (1 << 31) - 1  # floats per table (Taichi indexes ndarrays in 32 bits)
SCALING_GRID = {"otype": "HashGrid", "n_levels": 8, "n_features_per_level": 2, "log2_hashmap_size": 13,
                "base_resolution": 4, "per_level_scale": 1.5}
MLP = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU",
       "output_activation": "None"}
MLP_ONLY = {"n_inputs": 32, "n_outputs": 16, "network": MLP}  # the MLP-only array: 32 in, 2 x 64 hidden, 16 out
STRONG_TARGET, WEAK_TARGET = 1.85, 0.93
TCNN_GRID = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 19,
             "base_resolution": 16, "per_level_scale": 1.447}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path (written by rank 0)")
    p.add_argument("--tiny", action="store_true", help="CPU-sized check of the script (gloo)")
    p.add_argument("--networks", type=int, default=4096, help="N of the scaling runs")
    p.add_argument("--batch", type=int, default=1 << 22, help="B: global batch of the strong-scaling run")
    p.add_argument("--reps", type=int, default=20, help="timed steps per scaling run")
    p.add_argument("--models", default="grid,mlp", help="scaling models, comma-separated: grid, mlp")
    p.add_argument("--precisions", default="float32,float16",
                   help="network precisions, comma-separated: float32 (float32 kernels), float16 (tensor cores)")
    p.add_argument("--grid-precisions", default=None, help="precisions of the grid model (default: --precisions)")
    p.add_argument("--strategies", default="sharded",
                   help="comma-separated: sharded (ShardedPart), replicated (data parallel, Replicated)")
    p.add_argument("--replicated-models", default="mlp", help="models the replicated strategy runs on")
    p.add_argument("--reduce-dtypes", default="float32,bfloat16",
                   help="gradient reduce dtypes of the replicated runs: float32, bfloat16, float16")
    p.add_argument("--optimizer-splits", default="on",
                   help="replicated runs: on (the optimizer split over the ranks), off (all-reduce, whole optimizer)")
    p.add_argument("--exchange-dtypes", default="float32",
                   help="sharded runs: the dtype samples cross the link in: float32, float16, bfloat16")
    p.add_argument("--route-ahead", default="on",
                   help="sharded runs, comma-separated: on (Trainer.training_steps: each step routes the next batch "
                        "while it computes), off (Trainer.training_step, one batch at a time)")
    p.add_argument("--chunks", default="1,4",
                   help="ShardedPart chunks (pipelining) of the MLP-only runs, comma-separated")
    p.add_argument("--grid-chunks", default="1",
                   help="chunks of the hash-grid runs (each extra chunk adds a pass over the grid's gradient)")
    p.add_argument("--exchange-kernels", default="auto", choices=("auto", "triton", "torch"))
    p.add_argument("--profile-steps", type=int, default=5, help="profiled steps per sharded run (0: none)")
    p.add_argument("--kernel-profile", type=int, default=0,
                   help="rows of a CUDA kernel table (torch.profiler, ms per step) of the one-GPU step and of rank "
                        "0's strong step, printed and kept in the JSON (0: none)")
    p.add_argument("--big-gib", type=float, default=None,
                   help="training state (params, grads, Adam) of the big field in GiB (default: 1.1x one GPU)")
    p.add_argument("--big-steps", type=int, default=400)
    p.add_argument("--skip-big", action="store_true", help="scaling runs only (no big field)")
    p.add_argument("--big-batch", type=int, default=1 << 18, help="points per rank per step of the big field")
    p.add_argument("--res", type=int, default=64, help="held-out view size of the big field")
    args = p.parse_args()
    if args.tiny:
        args.networks, args.batch, args.reps, args.big_steps, args.big_batch, args.res = 16, 1 << 11, 3, 30, 4096, 16
        args.profile_steps = min(args.profile_steps, 2)
    def names(text):
        return [v.strip() for v in text.split(",") if v.strip()]

    args.models = names(args.models)
    args.precisions = {"mlp": names(args.precisions),
                       "grid": names(args.precisions if args.grid_precisions is None else args.grid_precisions)}
    args.chunks = {"mlp": [int(c) for c in names(args.chunks)], "grid": [int(c) for c in names(args.grid_chunks)]}
    args.strategies = names(args.strategies)
    args.replicated_models = names(args.replicated_models)
    args.reduce_dtypes = names(args.reduce_dtypes)
    args.optimizer_splits = names(args.optimizer_splits)
    args.exchange_dtypes = names(args.exchange_dtypes)
    args.route_ahead = names(args.route_ahead)
    allowed = {"models": ("grid", "mlp"), "precisions": ("float32", "float16"),
               "strategies": ("sharded", "replicated"), "replicated-models": ("grid", "mlp"),
               "reduce-dtypes": ("float32", "bfloat16", "float16"), "optimizer-splits": ("on", "off"),
               "exchange-dtypes": ("float32", "float16", "bfloat16"), "route-ahead": ("on", "off")}
    given = {"models": args.models, "precisions": args.precisions["mlp"] + args.precisions["grid"],
             "strategies": args.strategies, "replicated-models": args.replicated_models,
             "reduce-dtypes": args.reduce_dtypes, "optimizer-splits": args.optimizer_splits,
             "exchange-dtypes": args.exchange_dtypes, "route-ahead": args.route_ahead}
    for option, values in given.items():
        bad = [v for v in values if v not in allowed[option]]
        if bad:
            p.error(f"--{option}: unknown {bad}; allowed: {', '.join(allowed[option])}")
    return args


def tinn_tuning():
    import tinn
    return tinn.runtime.tuning()


def log(*a):
    if td.rank() == 0:
        print(*a, flush=True)


def barrier():
    with td.process.collective("a benchmark barrier"):
        torch.distributed.barrier()


def max_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=td.process.collective_device())
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return float(t.item())


def scaling_model(kind: str, grid, precision: str):
    """part_factory(n) of a scaling model and its (input, output) widths, its MLPs in `precision`: float32 (named:
    CUDA arrays default to float16 on the tensor cores), or float16 on the tensor cores."""
    from tinn.models import NetworkWithInputEncoding
    from tinn.networks import NetworkArray

    # float16 names the tensor-core kernels too: on the GPU that is what float16 chooses anyway, and under
    # Triton's CPU interpreter (the --tiny check) it is the only way to run them.
    chosen = {"precision": "float32"} if precision == "float32" else {"precision": precision,
                                                                     "kernels": "tensor_cores"}
    if kind == "mlp":
        def build(n):
            return NetworkArray(MLP_ONLY["n_inputs"], MLP_ONLY["n_outputs"], MLP_ONLY["network"], n_networks=n,
                                seed=5, **chosen)
        return build, (MLP_ONLY["n_inputs"], MLP_ONLY["n_outputs"])

    def build(n):
        model = NetworkWithInputEncoding(3, 4, grid, MLP, n_networks=n, seed=5)
        # The composition's MLPs in the row's precision rather than the default.
        model.network = NetworkArray(model.encoding.n_output_dims, 4, MLP, n_networks=n, seed=6, **chosen)
        return model
    return build, (3, 4)


def synthetic_batch(batch: int, dims, n_networks: int, seed: int):
    """(x, target, ids) of `batch` uniform samples for `n_networks` networks of `dims` (inputs, outputs) widths,
    on tinn's device, drawn from `seed` (the scaling runs' data; the tools in benchmarks/tools time the same)."""
    import tinn

    dev = tinn.runtime.device()
    g = torch.Generator(device=dev).manual_seed(seed)
    x = torch.rand(batch, dims[0], device=dev, generator=g)
    ids = torch.randint(0, n_networks, (batch,), device=dev, dtype=torch.int32, generator=g)
    target = torch.rand(batch, dims[1], device=dev, generator=g)
    return x, target, ids


def step_loop(trainer, x, target, ids, ahead: bool = False):
    """`run(k)`: k training steps on the batch, issued back to back; with `ahead` the next k steps of one
    `Trainer.training_steps` loop (each step routes the next batch while it computes; `run.close()` ends it), else
    one `training_step` at a time."""
    if ahead:
        steps = trainer.training_steps(itertools.repeat((x, target, ids)))

        def run(k):
            for _ in range(k):
                next(steps)
        run.close = steps.close
        return run

    def run(k):
        for _ in range(k):
            trainer.training_step(x, target, ids)
    run.close = lambda: None
    return run


def time_steps(trainer, batch: int, dims, n_networks: int, reps: int, seed: int, ahead: bool = False) -> float:
    import tinn
    from tinn import checks

    from benchmarks.common import settle

    x, target, ids = synthetic_batch(batch, dims, n_networks, seed)
    run = step_loop(trainer, x, target, ids, ahead)
    with checks.disabled():
        # compile, warm caches, capture the step graph and finish its trial (every rank alike)
        settle(lambda: run(1))
        run(3)  # routing ahead's own warm-up: its side stream and the kernels of its batches
        tinn.runtime.sync()
        t0 = time.perf_counter()
        run(reps)
        tinn.runtime.sync()
        elapsed = time.perf_counter() - t0
        run.close()
    return elapsed / reps


def _mark_optimizer(trainer, part) -> None:
    """The optimizer's step marked as the "optimizer" phase on the part's profiler (the time before it as
    "other"); a split optimizer's own marks put its all-gather in "reduce". Undone by `del optimizer.step`."""
    from tinn.distributed.profile import mark

    step = trainer.optimizer.step

    def marked(*a, **kw):
        mark(part, "other")
        step(*a, **kw)
        mark(part, "optimizer")
    trainer.optimizer.step = marked


def kernel_table(trainer, batch: int, dims, n_networks: int, rows: int, seed: int, ahead: bool = False) -> list[dict]:
    """The costliest CUDA kernels of a training step (torch.profiler: every stream, NCCL's too), ms per step; the
    host's wall time per step under the profiler as a last row."""
    import tinn
    from benchmarks.common import cuda_kernels
    from tinn import checks

    if not torch.cuda.is_available():
        return []
    x, target, ids = synthetic_batch(batch, dims, n_networks, seed)
    run = step_loop(trainer, x, target, ids, ahead)
    with checks.disabled():
        run(3)
        tinn.runtime.sync()
        t0 = time.perf_counter()
        table = cuda_kernels(lambda: run(5), n=1)
        wall = (time.perf_counter() - t0) / 5
        run.close()
        table = [dict(r, ms=r["ms"] / 5, calls=r["calls"] / 5) for r in table]
    return table[:rows] + [{"kernel": "(step wall time under the profiler)", "calls": 1, "ms": 1e3 * wall}]


def print_kernels(title: str, table: list[dict] | None) -> None:
    if table and td.rank() == 0:
        print(f"  kernels, {title}:", flush=True)
        for r in table:
            print(f"    {r['ms']:8.3f} ms {r['calls']:5.1f}x  {r['kernel']}", flush=True)


def profile_steps(trainer, part, batch: int, dims, n_networks: int, steps: int, seed: int, ahead: bool = False
                  ) -> dict:
    """Milliseconds per step in each phase on this rank (tinn/distributed/profile.py), and the step's wall time:
    averages over `steps` steps, taken after warm-up steps on the same batch."""
    import tinn
    from tinn import checks
    from tinn.distributed.profile import PhaseTimer

    x, target, ids = synthetic_batch(batch, dims, n_networks, seed)
    run = step_loop(trainer, x, target, ids, ahead)
    timer = PhaseTimer()
    try:
        with checks.disabled():
            # A new batch has new per-rank counts, which can select kernel variants not compiled yet (Triton
            # specialises on sizes): compile them before the profiled steps, with no profiler attached.
            run(3)
            _mark_optimizer(trainer, part)
            part.profiler = timer
            tinn.runtime.sync()
            t0 = time.perf_counter()
            timer.start()
            run(steps)
            timer.mark("other")
            phases = timer.collect(steps)
            wall = (time.perf_counter() - t0) / steps
            run.close()
    finally:
        part.profiler = None
        trainer.optimizer.__dict__.pop("step", None)
    out = {k: 1e3 * v for k, v in phases.items()}
    out["step_wall_ms"] = 1e3 * wall
    return out


def gather_objects(obj) -> list:
    return td.process.all_gather_objects(obj, "a benchmark gather")


def free_memory():
    """Drop what the previous run left: Python's garbage, then the CUDA caching allocator's free blocks."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def distributed_part(strategy: str, build, n_networks: int, chunks: int, reduce_dtype: str | None,
                     exchange_kernels: str, optimizer_split: str = "on", exchange_dtype: str = "float32"):
    """The array of a multi-GPU run: sharded over the ranks, or replicated on each (data parallel)."""
    if strategy == "replicated":
        return td.Replicated(build(n_networks), reduce_dtype=reduce_dtype, optimizer_split=optimizer_split == "on")
    return td.ShardedPart(build, n_networks, init="local", chunks=chunks, exchange_kernels=exchange_kernels,
                          exchange_dtype=exchange_dtype)


def exchange_accuracy(args, build, n_networks: int, batch: int, dims, chunks: int, exchange_dtype: str) -> dict:
    """Outputs and table gradients (an L2 loss's) of one batch through a sharded part exchanging in
    `exchange_dtype`, against the float32 exchange's with the same networks: max |difference| over max |value|
    of the outputs, and the relative L2 norm of each gradient's difference (max over ranks)."""
    x, target, ids = synthetic_batch(batch, dims, n_networks, seed=11 + td.rank())
    results = []
    for dtype in ("float32", exchange_dtype):
        part = distributed_part("sharded", build, n_networks, chunks, None, args.exchange_kernels,
                                exchange_dtype=dtype)
        y, ctx = part.forward_with_context(x, ids, train=True)
        dy = 2.0 * (y - target) / y.numel()
        _, grads = part.backward(ctx, dy, need_dx=False)
        results.append((y, [g.float() for g in grads if g is not None]))
        del part, ctx
    (y32, g32), (y16, g16) = results
    out = {"outputs_max_rel": float((y16 - y32).abs().max() / y32.abs().max().clamp_min(1e-30))}
    out["gradients_rel_l2"] = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(g16, g32)]
    everyone = gather_objects(out)
    free_memory()
    return {"outputs_max_rel": max(o["outputs_max_rel"] for o in everyone),
            "gradients_rel_l2": [max(v) for v in zip(*[o["gradients_rel_l2"] for o in everyone])]}


def scaling(args, kind: str, grid, precision: str, t1_cache: dict, strategy: str = "sharded", chunks: int = 1,
            reduce_dtype: str | None = None, optimizer_split: str = "on", exchange_dtype: str = "float32",
            route_ahead: str = "off") -> dict:
    """One row: the 1-GPU run (cached per model and precision), the strong and the weak run of `strategy`."""
    from tinn.distributed.optimizer_split import SplitOptimizer
    from tinn.trainer import Trainer

    world, rank = td.world_size(), td.rank()
    n, batch = args.networks, args.batch
    adam = {"otype": "Adam", "learning_rate": 1e-3}
    build, dims = scaling_model(kind, grid, precision)
    key = (kind, precision)
    if key not in t1_cache:  # the one-GPU run does not depend on the sharded part's chunks
        t1 = None
        if rank == 0:
            single = build(n)
            trainer1 = Trainer(single, optimizer=adam)
            t1 = time_steps(trainer1, batch, dims, n, args.reps, seed=1)
            t1_cache[key + ("graphs",)] = trainer1.step_graph_status
            if args.kernel_profile:
                t1_cache[key + ("kernels",)] = kernel_table(trainer1, batch, dims, n, args.kernel_profile, seed=1)
                print_kernels(f"{kind} {precision}, one GPU", t1_cache[key + ("kernels",)])
            del single, trainer1
            free_memory()
        barrier()
        t1_cache[key] = max_over_ranks(t1 or 0.0)
    t1 = t1_cache[key]
    runs = {}
    plan = [("strong", n, batch // world), ("weak", world * n, batch)]
    if strategy == "replicated":
        # Data parallelism's own weak scaling: the same array, B samples per rank (world x B in all).
        plan.append(("weak_data", n, batch))
    for run, n_run, per_rank in plan:
        part = distributed_part(strategy, build, n_run, chunks, reduce_dtype, args.exchange_kernels, optimizer_split,
                                exchange_dtype)
        trainer = Trainer(part, optimizer=adam)
        ahead = route_ahead == "on" and strategy == "sharded"
        t = max_over_ranks(time_steps(trainer, per_rank, dims, n_run, args.reps, seed=2 + rank, ahead=ahead))
        prof = profile_steps(trainer, part, per_rank, dims, n_run, args.profile_steps, seed=7 + rank, ahead=ahead) \
            if args.profile_steps else None
        kernels = None
        if args.kernel_profile and run == "strong":
            kernels = kernel_table(trainer, per_rank, dims, n_run, args.kernel_profile, seed=9 + rank, ahead=ahead)
            print_kernels(f"{kind} {precision} {strategy}, rank 0 of the strong run", kernels)
        runs[run] = {"step_ms": 1e3 * t, "profile_per_rank": gather_objects(prof), "kernels": kernels,
                     "step_graphs": trainer.step_graph_status,
                     "params_per_rank": sum(p.numel() for p in part.parameters()),
                     "split": isinstance(trainer.optimizer, SplitOptimizer)}
        del part, trainer
        free_memory()
    t_strong, t_weak = runs["strong"]["step_ms"] / 1e3, runs["weak"]["step_ms"] / 1e3
    replicated = strategy == "replicated"
    split = replicated and runs["strong"]["split"]
    reduce_bytes = REDUCE_BYTES.get(reduce_dtype, 4)
    accuracy = None
    if not replicated and exchange_dtype != "float32":
        accuracy = exchange_accuracy(args, build, n, min(batch // world, 1 << 18), dims, chunks, exchange_dtype)
    return {
        "model": kind, "precision": precision, "strategy": strategy, "chunks": None if replicated else chunks,
        "reduce_dtype": reduce_dtype, "exchange_kernels": None if replicated else args.exchange_kernels,
        "optimizer_split": split if replicated else None, "exchange_dtype": None if replicated else exchange_dtype,
        "route_ahead": None if replicated else route_ahead == "on",
        "exchange_accuracy_vs_float32": accuracy,
        "networks": n, "global_batch": batch, "world_size": world, "dims": list(dims),
        "single_gpu_step_ms": 1e3 * t1, "single_gpu_samples_per_s": batch / t1,
        "strong_step_ms": 1e3 * t_strong, "strong_samples_per_s": batch / t_strong,
        "strong_speedup": t1 / t_strong, "strong_target": STRONG_TARGET,
        "strong_profile_per_rank": runs["strong"]["profile_per_rank"],
        "strong_kernels_rank0": runs["strong"]["kernels"], "single_gpu_kernels": t1_cache.get(key + ("kernels",)),
        # Steps replayed from CUDA graphs (tinn/step_graphs.py) leave the phase profile's marks outside the graph:
        # their phases then all read as "other".
        "step_graphs": {"single_gpu": t1_cache.get(key + ("graphs",)),
                        **{run: r["step_graphs"] for run, r in runs.items()}},
        "reduce_pieces": tinn_tuning().reduce_pieces if replicated else None,
        "weak_networks": world * n, "weak_batch_per_rank": batch,
        "weak_step_ms": 1e3 * t_weak, "weak_per_gpu_samples_per_s": batch / t_weak,
        "weak_per_gpu_ratio": t1 / t_weak, "weak_target": WEAK_TARGET,
        "weak_profile_per_rank": runs["weak"]["profile_per_rank"],
        "weak_data_step_ms": runs["weak_data"]["step_ms"] if replicated else None,
        "weak_data_per_gpu_ratio": 1e3 * t1 / runs["weak_data"]["step_ms"] if replicated else None,
        # Sharded: what crosses the link per sample and step: the Trainer's step with the loss at the owners
        # sends inputs, targets and the local id, nothing back (a float32 exchange); else inputs + the id out,
        # outputs back, dy out. Replicated: nothing per sample; the reduction's bucket (every parameter, in the
        # reduce dtype) per step, and with the split optimizer the all-gather's (every parameter in float32).
        "exchanged_bytes_per_sample": 0 if replicated else td.exchange_bytes_per_sample(
            dims[0], dims[1], exchange_dtype=exchange_dtype, loss_at_owners=True),
        "params_per_rank_strong": runs["strong"]["params_per_rank"],
        "allreduce_bytes_per_step_strong": reduce_bytes * runs["strong"]["params_per_rank"] if replicated else 0,
        "allgather_bytes_per_step_strong": 4 * runs["strong"]["params_per_rank"] if split else 0,
    }


class SlabField(torch.nn.Module):
    """The scene box cut into g x g x k cells; z slab s is one ShardedPart of g*g networks (cell = its id)."""

    def __init__(self, box_min, box_max, g: int, k: int, grid, network):
        super().__init__()
        from tinn.models import NetworkWithInputEncoding

        self.register_buffer("box_min", box_min.float())
        self.register_buffer("box_max", box_max.float())
        self.g, self.k = g, k
        self.slabs = torch.nn.ModuleList(
            td.ShardedPart(lambda n, s=s: NetworkWithInputEncoding(3, 4, grid, network, n_networks=n, seed=100 + s),
                           g * g, init="local", config={"slab": s, "grid": grid})
            for s in range(k))

    def raw(self, points):
        cells = torch.tensor([self.g, self.g, self.k], device=points.device)
        scaled = (points - self.box_min) / (self.box_max - self.box_min) * cells
        q = torch.minimum(torch.floor(scaled).clamp_min(0), cells - 1)
        local = (scaled - q).clamp(0, 1).contiguous()
        q = q.long()
        ids = (q[:, 0] * self.g + q[:, 1]).to(torch.int32)
        out = torch.zeros(points.shape[0], 4, device=points.device)
        for s, part in enumerate(self.slabs):  # every rank calls every slab, with or without samples
            mask = (q[:, 2] == s).nonzero().squeeze(1)
            out = out.index_put((mask,), part(local[mask], ids[mask]))
        return out

    def forward(self, points):
        from tinn.scenes.fields.radiance import activate

        inside = ((points >= self.box_min) & (points <= self.box_max)).all(1)
        sigma, rgb = activate(self.raw(points))
        return torch.where(inside, sigma, torch.zeros_like(sigma)), rgb


def big_field(args) -> dict:
    import tinn
    from tinn.encodings import create_encoding
    from tinn.scenes.data.procedural import ProceduralScene, render_views
    from tinn.render import render_image
    from tinn.tasks.image import psnr
    from tinn.trainer import Trainer

    world, rank = td.world_size(), td.rank()
    dev = tinn.runtime.device()
    grid = dict(TCNN_GRID)
    if args.tiny:
        grid.update(n_levels=4, log2_hashmap_size=10, base_resolution=4)
    network = {"otype": "FullyFusedMLP", "n_neurons": 64, "n_hidden_layers": 1, "activation": "ReLU",
               "output_activation": "None"}
    per_network = create_encoding(3, grid, n_networks=1).n_params_per_network()
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
    state_bytes = args.big_gib * 2**30 if args.big_gib else (1.1 * gpu_bytes if gpu_bytes else 2**24)
    # g*g networks per slab; one table per slab and rank stays below 2^31 floats even unsharded.
    g = max(1, int(math.isqrt(MAX_TABLE // per_network)))
    g -= g % 2 if g > 2 else 0
    k = max(world, math.ceil(state_bytes / (16 * per_network * g * g)))  # params + grad + Adam m, v: 16 B each
    if args.tiny:
        g, k = 2, 2
    scene = ProceduralScene()
    test = render_views(scene, 2, args.res, args.res, seed=1000)
    barrier()
    t0 = time.perf_counter()
    field = SlabField(test.box_min.to(dev), test.box_max.to(dev), g, k, grid, network).to(dev)
    build_s = time.perf_counter() - t0
    step_size = float((test.box_max - test.box_min).norm()) / 128
    gen = torch.Generator(device=dev).manual_seed(77 + rank)
    lo, hi = field.box_min, field.box_max

    def loss():
        pts = lo + (hi - lo) * torch.rand(args.big_batch, 3, device=dev, generator=gen)
        with torch.no_grad():
            alpha_t = 1 - torch.exp(-scene.density(pts) * step_size)
            rgb_t = scene.color(pts)
        sigma, rgb = field(pts)
        alpha = 1 - torch.exp(-sigma * step_size)
        return ((alpha - alpha_t) ** 2).mean() + (alpha_t[:, None] * (rgb - rgb_t) ** 2).mean()

    trainer = Trainer(field, optimizer={"otype": "Adam", "learning_rate": 1e-2, "beta2": 0.99, "epsilon": 1e-15})
    torch.cuda.reset_peak_memory_stats() if torch.cuda.is_available() else None
    tinn.runtime.sync()
    t0 = time.perf_counter()
    last = None
    for step in range(args.big_steps):
        last = trainer.optimize(loss)
        if step % max(args.big_steps // 5, 1) == 0:
            log(f"  big field step {step}: loss {float(last):.5f}")
    tinn.runtime.sync()
    train_s = time.perf_counter() - t0
    with torch.no_grad():
        views = [render_image(field, test.c2w[v].to(dev), test.width, test.height, test.focal, n_samples=128,
                              background=test.background.to(dev), occupancy=None) for v in range(len(test))]
    value = sum(psnr(out.rgb, test.images[v].to(dev)) for v, out in enumerate(views)) / len(views)
    n_params = sum(p.numel() for p in field.parameters())
    return {
        "cells": g * g * k, "slabs": k, "cells_per_slab": g * g, "grid": grid, "network": network,
        "params_per_cell": per_network, "params_total": per_network * g * g * k,
        "params_this_rank": n_params,
        "training_state_bytes_total": 16 * per_network * g * g * k, "gpu_memory_bytes": gpu_bytes,
        "fits_one_gpu": bool(gpu_bytes) and 16 * per_network * g * g * k < gpu_bytes,
        "largest_table_floats_per_rank": max(p.numel() for p in field.parameters()),
        "peak_gpu_bytes_per_rank": max_over_ranks(torch.cuda.max_memory_allocated() if torch.cuda.is_available()
                                                  else 0),
        "build_s": build_s, "steps": args.big_steps, "train_s": train_s, "final_loss": float(last),
        "heldout_psnr": value, "heldout_views": len(test), "res": args.res,
    }


PROFILED = ("exchange", "compute", "reduce", "idle", "optimizer", "other")
_PROFILE_HEAD = "strong-run profile, rank 0, ms: exch compute reduce idle optim other"


def _phases(profile) -> str:
    if not profile:
        return ""
    return " ".join(f"{profile.get(k, 0.0):.2f}" for k in PROFILED)


def summary_table(rows: list[dict], world: int) -> list[str]:
    """The scaling table (rank 0's profile of the strong run: ms per step in each phase; the other ranks' on a line
    each below it, since a rank that reaches a collective first waits there for the slowest)."""
    head = (f"{'model':<6}{'prec':<9}{'strategy':<30}{'1 GPU ms':>10}{f'{world} GPU ms':>10}{'strong':>8}"
            f"{'weak ms':>9}{'weak/GPU':>9}{'same N':>8}   {_PROFILE_HEAD}")
    column = len(head) - len(_PROFILE_HEAD)  # where the profile column starts
    lines = [head]
    for s in rows:
        prof = (s["strong_profile_per_rank"] or [None])[0]
        how = (f"replicated {s['reduce_dtype']}{' split' if s.get('optimizer_split') else ''}"
               if s.get("strategy") == "replicated"
               else f"sharded chunks={s['chunks']} {s.get('exchange_dtype') or 'float32'}"
                    + (" ahead" if s.get("route_ahead") else ""))
        lines.append(f"{s['model']:<6}{s['precision']:<9}{how:<30}{s['single_gpu_step_ms']:>10.2f}"
                     f"{s['strong_step_ms']:>10.2f}{s['strong_speedup']:>7.2f}x{s['weak_step_ms']:>9.2f}"
                     f"{s['weak_per_gpu_ratio']:>9.2f}"
                     f"{'-' if s.get('weak_data_per_gpu_ratio') is None else format(s['weak_data_per_gpu_ratio'], '.2f'):>8}"
                     f"   {_phases(prof)}")
        for r, other in enumerate((s["strong_profile_per_rank"] or [])[1:], start=1):
            if other:
                lines.append(f"{f'rank {r}:':>{column - 1}} {_phases(other)}")
    lines.append(f"targets: strong >= {STRONG_TARGET}x, weak >= {WEAK_TARGET} per GPU; global batch "
                 f"{rows[0]['global_batch'] if rows else 0}, {rows[0]['networks'] if rows else 0} networks")
    return lines


def main():
    args = parse_args()
    arch = td.init()
    if arch == "cpu":
        torch.set_num_threads(1)
    world = td.world_size()
    log(f"bench_sharded: {world} ranks on {arch}")
    if arch != "cuda" and os.environ.get("TRITON_INTERPRET") != "1" and \
            any("float16" in q for q in args.precisions.values()):
        log("  float16 (the tensor-core kernels) needs CUDA or TRITON_INTERPRET=1: those runs are skipped")
        args.precisions = {k: [q for q in v if q != "float16"] for k, v in args.precisions.items()}
    t0 = time.perf_counter()
    grid = dict(SCALING_GRID, n_levels=4, log2_hashmap_size=8) if args.tiny else SCALING_GRID
    result = {"arch": arch, "world_size": world, "grid": grid, "network": MLP, "mlp_only": MLP_ONLY,
              "scaling": []}
    t1_cache = {}
    for kind in args.models:
        for precision in args.precisions[kind]:
            runs = []
            if "sharded" in args.strategies:
                runs += [dict(strategy="sharded", chunks=c, exchange_dtype=x, route_ahead=a) for c in args.chunks[kind]
                         for x in args.exchange_dtypes for a in args.route_ahead]
            if "replicated" in args.strategies and kind in args.replicated_models:
                runs += [dict(strategy="replicated", reduce_dtype=d, optimizer_split=o) for d in args.reduce_dtypes
                         for o in args.optimizer_splits]
            for run in runs:
                s = scaling(args, kind, grid, precision, t1_cache, **run)
                result["scaling"].append(s)
                log(f"  {kind} {precision} {' '.join(f'{k}={v}' for k, v in run.items())}: 1 GPU "
                    f"{s['single_gpu_step_ms']:.2f} ms, strong {s['strong_speedup']:.2f}x, weak "
                    f"{s['weak_per_gpu_ratio']:.2f} per GPU; step graphs: {s['step_graphs']}"
                    + (f"; vs the float32 exchange: outputs {s['exchange_accuracy_vs_float32']['outputs_max_rel']:.2e}"
                       f", gradients {max(s['exchange_accuracy_vs_float32']['gradients_rel_l2']):.2e}"
                       if s["exchange_accuracy_vs_float32"] else ""))
    b = result["big_field"] = None if args.skip_big else big_field(args)
    if b is not None:
        log(f"big field: {b['cells']} cells in {b['slabs']} slabs, {b['params_total'] / 1e9:.2f} G params, "
            f"training state {b['training_state_bytes_total'] / 2**30:.1f} GiB (one GPU: "
            f"{b['gpu_memory_bytes'] / 2**30:.1f} GiB, fits: {b['fits_one_gpu']}); peak per rank "
            f"{b['peak_gpu_bytes_per_rank'] / 2**30:.1f} GiB; {b['steps']} steps in {b['train_s']:.1f} s; "
            f"held-out PSNR {b['heldout_psnr']:.2f} dB")
    result["total_s"] = time.perf_counter() - t0
    if td.rank() == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"JSON in {args.out} ({result['total_s']:.0f} s)")
        print("\n".join(summary_table(result["scaling"], world)), flush=True)
    td.shutdown()


if __name__ == "__main__":
    main()

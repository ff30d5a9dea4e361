"""Where a multi-GPU training step's time goes, from a torch.profiler timeline of each rank: per stream, the
kernels' busy time; on the compute stream, the gaps where the device waited for the host (the next kernel was
launched after the previous one ended) and those where it waited for another stream (a collective, an event).

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m benchmarks.tools.sharded_step_trace \
        --variants one,sharded_ahead,replicated --out out/trace

Variants (--model: the MLP-only or the hash-grid array of benchmarks/bench_sharded.py, float16 tensor cores,
global batch --batch):
one (rank 0 alone, the whole batch), sharded_ahead / sharded (a ShardedPart, routed ahead or one batch at a
time), replicated (td.Replicated, float32 all-reduce), replicated_split (its optimizer split over the ranks),
replicated_bf16. Each rank writes its Chrome trace (gzipped) and a summary; rank 0 prints a table.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import time

import tinn.distributed as td
from benchmarks import bench_sharded as bs
from benchmarks.common import write_json


VARIANTS = ("one", "sharded", "sharded_ahead", "replicated", "replicated_split", "replicated_bf16")


def summarise(trace: dict, steps: int) -> dict:
    """ms per step: busy time per stream, and the compute stream's host-bound and other gaps."""
    events = trace.get("traceEvents", [])
    launches = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e["ts"]
    by_stream = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            by_stream[e["args"].get("stream", -1)].append(e)
    out = {"streams": {}}
    compute = max(by_stream, key=lambda s: len(by_stream[s])) if by_stream else None
    for s, ks in by_stream.items():
        ks.sort(key=lambda e: e["ts"])
        busy = sum(e["dur"] for e in ks)
        names = collections.Counter()
        for e in ks:
            names[e["name"][:48]] += e["dur"]
        out["streams"][str(s)] = {"busy_ms": busy / 1e3 / steps, "kernels": len(ks) / steps,
                                  "top": [[n, d / 1e3 / steps] for n, d in names.most_common(8)]}
    if compute is not None:
        ks = by_stream[compute]
        host_gap = other_gap = 0.0
        for a, b in zip(ks, ks[1:]):
            gap = b["ts"] - (a["ts"] + a["dur"])
            if gap <= 0:
                continue
            launched = launches.get(b["args"].get("correlation"))
            if launched is not None and launched > a["ts"] + a["dur"]:
                host = min(gap, launched - (a["ts"] + a["dur"]))
                host_gap += host
                other_gap += gap - host
            else:
                other_gap += gap
        span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
        out.update(compute_stream=str(compute), span_ms=span / 1e3 / steps, host_gap_ms=host_gap / 1e3 / steps,
                   other_gap_ms=other_gap / 1e3 / steps)
    return out


def trace_steps(run, steps: int, path: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    import tinn
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(steps)
        tinn.runtime.sync()
    tmp = path + ".json"
    prof.export_chrome_trace(tmp)
    with open(tmp) as f:
        trace = json.load(f)
    with gzip.open(path + ".json.gz", "wt") as f:
        json.dump(trace, f)
    os.remove(tmp)
    return summarise(trace, steps)


def measure(trainer, dims, per_rank: int, n: int, seed: int, ahead: bool, steps: int, reps: int, path: str,
            host_profile: int = 0) -> dict:
    import tinn
    from tinn import checks
    from benchmarks.common import settle, time_pipelined_blocks

    x, target, ids = bs.synthetic_batch(per_rank, dims, n, seed)
    run = bs.step_loop(trainer, x, target, ids, ahead)
    with checks.disabled():
        settle(lambda: run(1))
        (wall,) = time_pipelined_blocks(lambda: run(1), 3, reps, 1)
        # Host issue time: steps enqueued right after a sync (the device catches up only at a header read).
        t0 = time.perf_counter()
        run(4)
        host = (time.perf_counter() - t0) / 4
        tinn.runtime.sync()
        summary = trace_steps(run, steps, path)
        if host_profile:
            import cProfile
            import io
            import pstats
            prof = cProfile.Profile()
            prof.enable()
            run(host_profile)
            tinn.runtime.sync()
            prof.disable()
            text = io.StringIO()
            stats = pstats.Stats(prof, stream=text).strip_dirs()
            stats.sort_stats("tottime").print_stats(45)
            stats.sort_stats("cumulative").print_stats(60)
            with open(path + ".pstats.txt", "w") as f:
                f.write(text.getvalue())
        run.close()
    return dict(summary, wall_ms=1e3 * wall, issue_ms=1e3 * host)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--variants", default="one,sharded_ahead,replicated")
    p.add_argument("--networks", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1 << 22)
    p.add_argument("--steps", type=int, default=4, help="traced steps")
    p.add_argument("--reps", type=int, default=20, help="timed steps")
    p.add_argument("--host-profile", type=int, default=0, help="steps run under cProfile after the trace (0: none)")
    p.add_argument("--model", default="mlp", choices=("mlp", "grid"))
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"--variants {unknown} are not known; allowed: {list(VARIANTS)}")
    td.init()
    from tinn.trainer import Trainer

    world, rank = td.world_size(), td.rank()
    os.makedirs(args.out, exist_ok=True)
    build, dims = bs.scaling_model(args.model, bs.SCALING_GRID, "float16")
    adam = {"otype": "Adam", "learning_rate": 1e-3}
    rows = {}
    for variant in variants:
        path = os.path.join(args.out, f"{variant}_rank{rank}")
        if variant == "one":
            result = None
            if rank == 0:
                trainer = Trainer(build(args.networks), optimizer=adam)
                result = measure(trainer, dims, args.batch, args.networks, 1, False, args.steps, args.reps, path,
                                 args.host_profile)
                del trainer
            bs.barrier()
        else:
            if variant.startswith("sharded"):
                part = td.ShardedPart(build, args.networks, init="local")
            else:
                part = td.Replicated(build(args.networks), reduce_dtype="bfloat16" if variant.endswith("bf16")
                                     else "float32", optimizer_split=variant.endswith("split"))
            trainer = Trainer(part, optimizer=adam)
            result = measure(trainer, dims, args.batch // world, args.networks, 2 + rank,
                             variant == "sharded_ahead", args.steps, args.reps, path, args.host_profile)
            del part, trainer
        bs.free_memory()
        rows[variant] = bs.gather_objects(result)
    if rank == 0:
        write_json(os.path.join(args.out, "summary.json"), rows)
        print(f"{'variant':<18}{'rank':>5}{'wall':>8}{'issue':>8}{'span':>8}{'host gap':>10}{'other gap':>10}"
              "  busy per stream (ms a step)")
        for variant, per_rank in rows.items():
            for r, s in enumerate(per_rank):
                if s is None:
                    continue
                busy = " ".join(f"{k}:{v['busy_ms']:.2f}" for k, v in s["streams"].items())
                print(f"{variant:<18}{r:>5}{s['wall_ms']:>8.2f}{s['issue_ms']:>8.2f}{s.get('span_ms', 0):>8.2f}"
                      f"{s.get('host_gap_ms', 0):>10.2f}{s.get('other_gap_ms', 0):>10.2f}  {busy}")
    td.shutdown()


if __name__ == "__main__":
    main()

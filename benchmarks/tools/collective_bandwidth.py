"""The collectives a data-parallel step issues, timed alone: reduce-scatter, all-gather and all-reduce of the
sizes a `td.Replicated` array moves, so that NCCL's settings (its `NCCL_*` environment: channels, protocol,
algorithm) can be compared without the step around them.

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node 2 -m benchmarks.tools.collective_bandwidth \
        --mbytes 117.6 --dtypes float32,bfloat16 --out out/collectives.json

On a machine without CUDA the same collectives run over gloo on the CPU (the tool's own test). `--mbytes` is the
whole buffer (all ranks' slices together), as the split optimizer's reduce-scatter of the
gradient and all-gather of the parameters see it. Bus bandwidth follows nccl-tests' convention: (w - 1) / w of the
buffer per rank and direction for the reduce-scatter and all-gather, 2 (w - 1) / w for the all-reduce. Rank 0
prints the medians and writes them, with the NCCL environment of the run, as JSON.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from benchmarks.common import gpu_ms, time_fn, write_json
from tinn.distributed.process import all_gather_flat, reduce_scatter_flat

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _median_ms(fn, reps: int, device: torch.device) -> float:
    """fn's median time: between CUDA events on a GPU, synced wall time on the CPU (gloo)."""
    if device.type == "cuda":
        return gpu_ms(fn, reps)
    return 1e3 * time_fn(fn, warmup=3, reps=reps)


def check_results(per_rank: int, dtype: torch.dtype, device: torch.device) -> None:
    """Each collective once on known values (rank r contributes r + 1): a wrong result stops the run before any
    time is taken."""
    world, rank = dist.get_world_size(), dist.get_rank()
    total = world * (world + 1) / 2
    full = torch.full((per_rank * world,), rank + 1.0, dtype=dtype, device=device)
    part = torch.empty(per_rank, dtype=dtype, device=device)
    reduce_scatter_flat(part, full)
    gathered = torch.empty_like(full)
    all_gather_flat(gathered, torch.full((per_rank,), rank + 1.0, dtype=dtype, device=device))
    dist.all_reduce(full)
    expected_gather = torch.arange(1, world + 1, dtype=dtype, device=device).repeat_interleave(per_rank)
    for name, got, want in (("reduce_scatter", part, torch.full_like(part, total)),
                            ("all_gather", gathered, expected_gather),
                            ("all_reduce", full, torch.full_like(full, total))):
        if not torch.equal(got, want):
            raise RuntimeError(f"{name} over {dtype} returned wrong values on rank {rank}")


def measure(n_bytes: float, dtype: torch.dtype, reps: int, device: torch.device) -> list[dict]:
    """Each collective's median time and bus bandwidth for one buffer size and dtype."""
    world = dist.get_world_size()
    itemsize = torch.tensor([], dtype=dtype).element_size()
    per_rank = max(1, int(n_bytes) // (itemsize * world))
    check_results(per_rank, dtype, device)
    full = torch.ones(per_rank * world, dtype=dtype, device=device)
    part = torch.ones(per_rank, dtype=dtype, device=device)
    ops = {
        "reduce_scatter": (lambda: reduce_scatter_flat(part, full), (world - 1) / world),
        "all_gather": (lambda: all_gather_flat(full, part), (world - 1) / world),
        "all_reduce": (lambda: dist.all_reduce(full), 2 * (world - 1) / world),
    }
    rows = []
    for name, (fn, factor) in ops.items():
        dist.barrier()
        ms = _median_ms(fn, reps, device)
        buffer = full.numel() * itemsize
        rows.append({"op": name, "dtype": str(dtype).removeprefix("torch."), "buffer_bytes": buffer, "ms": ms,
                     "bus_gb_s": buffer * factor / (ms * 1e-3) / 1e9})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="JSON results path (written by rank 0)")
    p.add_argument("--mbytes", default="117.6", help="whole-buffer sizes in MB (1e6 bytes), comma-separated")
    p.add_argument("--dtypes", default="float32,bfloat16", help=f"comma-separated, of {sorted(_DTYPES)}")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--label", default="", help="a name for this run's NCCL settings, carried into the JSON")
    args = p.parse_args()
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad or args.reps < 1:
        p.error(f"--dtypes takes {sorted(_DTYPES)} (got {bad}); --reps at least 1")
    sizes = [float(v) * 1e6 for v in args.mbytes.split(",") if v.strip()]
    if not sizes or min(sizes) <= 0:
        p.error("--mbytes takes positive sizes, comma-separated")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rows = [r for n in sizes for d in dtypes for r in measure(n, _DTYPES[d], args.reps, device)]
    if dist.get_rank() == 0:
        env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}
        # the run's settings, not its logging or the container's record of the library version
        tuned = {k: v for k, v in env.items()
                 if k not in ("NCCL_NVLS_ENABLE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_VERSION")}
        label = args.label or ",".join(f"{k}={v}" for k, v in tuned.items()) or "default"
        print(f"{'settings':<34} {'op':<15} {'dtype':<9} {'MB':>7} {'ms':>7} {'bus GB/s':>9}")
        for r in rows:
            print(f"{label:<34} {r['op']:<15} {r['dtype']:<9} {r['buffer_bytes'] / 1e6:7.1f} {r['ms']:7.3f} "
                  f"{r['bus_gb_s']:9.1f}")
        nccl = ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None
        payload = {"label": label, "backend": dist.get_backend(), "nccl_env": env,
                   "world_size": dist.get_world_size(), "nccl_version": nccl, "rows": rows}
        write_json(args.out, payload)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A single grid's table gradient several ways on one GPU, in one process: Taichi's kernel (the coarse levels summed
in shared memory first), the Triton lanes kernel (one lane per sample and feature, global atomics), and the Triton
variants that take a sample per lane and add its F features to a corner with vector reductions
(`red.global.add.v2.f32` / `.v4.f32`, sm_90): alone, with the coarse levels' atomics spread over private copies of
those levels that a second launch sums into the gradient (for each count of `--copies`, with the coarse levels of
at most 16,384 values private, the default, and with every level of at most 65,536 values), and each of those again
with a cell's corner pairs along the first axis in one four-word reduction where their entries pair up.

    python -m benchmarks.tools.grid_gradient_variants [--rounds 3] [--copies 16,32,64] [--json out.json]

Cases: tcnn's image grid (2-D, 16 levels of 2^15, 2^18 samples) and tcnn's 3-D grid (16 levels of 2^19, 2^21
samples). Per variant: device ms (CUDA events, median of rounds) and the largest difference from Taichi's gradient
relative to its largest entry. CUDA only (the vector reductions are sm_90 instructions).
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import tinn  # noqa: E402
from benchmarks.common import gpu_ms, print_table, write_json  # noqa: E402

CASES = {
    "image 2-D, 2^18": dict(dims=2, levels=16, log2=15, scale=1.5, samples=1 << 18),
    "tcnn 3-D, 2^21": dict(dims=3, levels=16, log2=19, scale=2.0, samples=1 << 21),
}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--copies", default="16,32,64")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("grid_gradient_variants needs CUDA")
    from tinn.encodings.grid import GridEncoding
    from tinn.kernels import grid_triton
    dev = tinn.runtime.device()
    rows = []
    for label, spec in CASES.items():
        enc = GridEncoding(spec["dims"], n_levels=spec["levels"], log2_hashmap_size=spec["log2"], base_resolution=16,
                           per_level_scale=spec["scale"])
        gen = torch.Generator(device=dev).manual_seed(0)
        n = spec["samples"]
        x = torch.rand(n, spec["dims"], device=dev, generator=gen)
        ids = torch.zeros(n, dtype=torch.int32, device=dev)
        table = enc.params.detach()
        dy = torch.randn(enc.n_output_dims, n, device=dev, generator=gen)
        grad = torch.zeros_like(table)
        f, interp, gtype = enc._codes()
        levels = grid_triton.LevelTable(enc._meta_values(), dev)
        base = tinn.settings.installed()

        def taichi():
            tinn.settings.install(base.replace(triton_grid_kernels=False))
            enc.lookup_backward(x, ids, table, 0, dy, grad, False, "feature_major")
            tinn.settings.install(base)

        def triton(vector=False, copies=0, max_floats=grid_triton.PRIVATE_MAX_FLOATS, pairs=False):
            kept = grid_triton.PRIVATE_MAX_FLOATS, grid_triton.PAIRED_CORNERS
            grid_triton.PRIVATE_MAX_FLOATS, grid_triton.PAIRED_CORNERS = max_floats, pairs
            grid_triton.grid_backward_table(x, ids, 0, levels, dy, grad, f, interp, gtype, spec["dims"], 0,
                                            enc._hashing, vector=vector, copies=copies)
            grid_triton.PRIVATE_MAX_FLOATS, grid_triton.PAIRED_CORNERS = kept

        variants = {"taichi (shared memory)": taichi, "triton lanes": triton,
                    "triton vector": lambda: triton(vector=True)}
        for pairs in (False, True):
            if pairs:
                variants["triton vector, pairs"] = lambda: triton(vector=True, pairs=True)
            for copies in (int(c) for c in args.copies.split(",")):
                for max_floats in (16384, 65536):
                    grid_triton.PRIVATE_MAX_FLOATS, kept = max_floats, grid_triton.PRIVATE_MAX_FLOATS
                    count = grid_triton.private_levels(levels, f)[0]
                    grid_triton.PRIVATE_MAX_FLOATS = kept
                    variants[f"triton vector{', pairs' if pairs else ''}, {copies} copies of {count} levels"] = (
                        lambda copies=copies, max_floats=max_floats, pairs=pairs: triton(True, copies, max_floats,
                                                                                         pairs))
        results = {}
        for name, fn in variants.items():
            grad.zero_()
            fn()
            results[name] = grad.double().clone()
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(gpu_ms(fn))
        ref = results["taichi (shared memory)"]
        for name in variants:
            rows.append({"case": label, "variant": name, "ms": statistics.median(times[name]),
                         "rel_diff": float((results[name] - ref).abs().max() / ref.abs().max())})
        del variants, results
        torch.cuda.empty_cache()
    print_table(rows, [("case", "case", "s"), ("variant", "variant", "s"), ("ms", "table grad ms", ".3f"),
                       ("rel_diff", "rel diff vs Taichi", ".1e")])
    payload = {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "rows": rows}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()

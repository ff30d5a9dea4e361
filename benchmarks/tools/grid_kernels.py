"""A grid encoding's lookup and table gradient on both launch paths side by side in one process
(`tuning.triton_grid_kernels`: Taichi's kernels, Triton launches), alternating in rounds because a host's speed
drifts within a process and differs between processes.

    python -m benchmarks.tools.grid_kernels [--rounds 3] [--steps 100] [--json out.json]

Kernel cases (forward and table gradient alone): tcnn's image grid (2-D, 16 levels of 2^15, 2^18 samples), tcnn's
3-D grid (16 levels of 2^19, 2^21 samples), nine such grids picked by octant (an octree's leaves; samples drawn
uniformly, or 256 along each ray as a scene draws them), and the sharded
benchmark's array (4096 grids of 8 levels of 2^13, 2^22 samples, ids interleaved). Per case and path: device ms of
each call (CUDA events), host us of each call (calls issued right after a sync), and the largest difference between
the paths' features and table gradients. Step cases: tcnn's image step (`config_hash.json`) in float32 and float16,
wall and host ms per step. CUDA only.
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import tinn  # noqa: E402
from benchmarks.common import gpu_ms, host_ms_per_step, pipelined_ms, print_table, sync, write_json  # noqa: E402
from benchmarks.tools.triton_step_kernels import image_case  # noqa: E402

PATHS = (("taichi", False), ("triton", True))
KERNEL_CASES = {
    "image 2-D, 1 grid, 2^18": dict(dims=2, levels=16, log2=15, scale=1.5, nets=1, samples=1 << 18, ids="zero"),
    "tcnn 3-D, 1 grid, 2^21": dict(dims=3, levels=16, log2=19, scale=2.0, nets=1, samples=1 << 21, ids="zero"),
    "octree 3-D, 9 grids, 2^21": dict(dims=3, levels=16, log2=19, scale=2.0, nets=9, samples=1 << 21, ids="octant"),
    "octree 3-D, 9 grids, 2^21 along rays": dict(dims=3, levels=16, log2=19, scale=2.0, nets=9, samples=1 << 21,
                                                 ids="octant", rays=256),
    "array 3-D, 4096 grids, 2^22": dict(dims=3, levels=8, log2=13, scale=2.0, nets=4096, samples=1 << 22,
                                        ids="interleaved"),
}


def _use(flag: bool) -> None:
    tinn.settings.install(tinn.settings.installed().replace(triton_grid_kernels=flag))


def kernel_case(spec: dict):
    from tinn.encodings.grid import GridEncoding
    dev = tinn.runtime.device()
    enc = GridEncoding(spec["dims"], n_levels=spec["levels"], log2_hashmap_size=spec["log2"], base_resolution=16,
                       per_level_scale=spec["scale"], n_networks=spec["nets"])
    with torch.no_grad():
        enc.params.uniform_(-1, 1)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.rand(spec["samples"], spec["dims"], device=dev, generator=gen)
    if spec.get("rays"):  # consecutive samples along rays through the unit cube, as a scene's batches come
        n_rays = spec["samples"] // spec["rays"]
        start = torch.rand(n_rays, 1, 3, device=dev, generator=gen)
        end = torch.rand(n_rays, 1, 3, device=dev, generator=gen)
        t = torch.linspace(0, 1, spec["rays"], device=dev).view(1, -1, 1)
        x = (start + t * (end - start)).reshape(-1, 3).contiguous()
    if spec["ids"] == "octant":  # the root's centre cell and its eight children, by where a sample lies
        octant = ((x[:, 0] > 0.5).int() + 2 * (x[:, 1] > 0.5).int() + 4 * (x[:, 2] > 0.5).int()) + 1
        centre = ((x - 0.5).abs().amax(1) < 0.1)
        ids = torch.where(centre, 0, octant).to(torch.int32)
    elif spec["ids"] == "interleaved":
        ids = (torch.arange(spec["samples"], device=dev) % spec["nets"]).to(torch.int32)
    else:
        ids = torch.zeros(spec["samples"], dtype=torch.int32, device=dev)
    table = enc.params.detach()
    dy = torch.randn(enc.n_output_dims, spec["samples"], device=dev, generator=gen)
    grad = torch.zeros_like(table)

    def forward():
        return enc.lookup(x, ids, table, 0, "feature_major")

    def backward():
        enc.lookup_backward(x, ids, table, 0, dy, grad, False, "feature_major")

    return forward, backward, grad


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--no-steps", action="store_true", help="the kernel cases alone")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("grid_kernels needs CUDA (the Triton path's default)")
    base = tinn.settings.installed()
    rows = []
    for label, spec in KERNEL_CASES.items():
        forward, backward, grad = kernel_case(spec)
        results, measured = {}, {name: {"fwd": [], "bwd": [], "fwd_host": [], "bwd_host": []} for name, _ in PATHS}
        for name, flag in PATHS:  # compile, and keep each path's outputs for the comparison
            _use(flag)
            grad.zero_()
            backward()
            results[name] = (forward().clone(), grad.clone())
        for _ in range(args.rounds):
            for name, flag in PATHS:
                _use(flag)
                m = measured[name]
                m["fwd"].append(gpu_ms(forward))
                m["bwd"].append(gpu_ms(backward))
                m["fwd_host"].append(1e3 * host_ms_per_step(forward))
                m["bwd_host"].append(1e3 * host_ms_per_step(backward))
        (f_a, g_a), (f_b, g_b) = results["taichi"], results["triton"]
        for name, _ in PATHS:
            m = measured[name]
            rows.append({"case": label, "path": name, "forward_ms": statistics.median(m["fwd"]),
                         "backward_ms": statistics.median(m["bwd"]),
                         "forward_host_us": statistics.median(m["fwd_host"]),
                         "backward_host_us": statistics.median(m["bwd_host"]),
                         "features_max_diff": float((f_a - f_b).abs().max()),
                         "gradient_max_rel_diff": float((g_a - g_b).abs().max() / g_a.abs().max().clamp_min(1e-30))})
        del forward, backward, grad, results
        torch.cuda.empty_cache()
    tinn.settings.install(base)
    print_table(rows, [("case", "case", "s"), ("path", "launches", "s"), ("forward_ms", "fwd ms", ".3f"),
                       ("backward_ms", "table grad ms", ".3f"), ("forward_host_us", "fwd host us", ".1f"),
                       ("backward_host_us", "grad host us", ".1f"), ("features_max_diff", "features diff", ".1e"),
                       ("gradient_max_rel_diff", "grad rel diff", ".1e")])
    steps = []
    if not args.no_steps:
        for precision in ("float32", "float16"):
            trainer, batches = image_case(precision)
            counter = iter(range(1 << 30))

            def step():
                trainer.training_step(*batches[next(counter) % len(batches)])

            measured = {name: {"wall": [], "host": []} for name, _ in PATHS}
            with tinn.checks.disabled():
                for name, flag in PATHS:
                    _use(flag)
                    for _ in range(5):
                        step()
                for _ in range(args.rounds):
                    for name, flag in PATHS:
                        _use(flag)
                        measured[name]["wall"].append(pipelined_ms(step, args.steps))
                        measured[name]["host"].append(host_ms_per_step(step))
            for name, _ in PATHS:
                steps.append({"case": f"image step {precision}", "path": name,
                              "wall_ms": statistics.median(measured[name]["wall"]),
                              "wall_spread_ms": [min(measured[name]["wall"]), max(measured[name]["wall"])],
                              "host_ms": statistics.median(measured[name]["host"])})
            tinn.settings.install(base)
        sync()
        print_table(steps, [("case", "case", "s"), ("path", "launches", "s"), ("wall_ms", "step ms", ".3f"),
                            ("host_ms", "host ms", ".3f")])
    payload = {"device": torch.cuda.get_device_name(), "rounds": args.rounds, "kernels": rows, "steps": steps}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()

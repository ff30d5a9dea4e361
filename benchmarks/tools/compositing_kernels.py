"""Volume compositing on both launch paths side by side in one process (`tuning.triton_render_kernels`: Taichi's
kernels, one thread a ray; Triton's, a ray's samples a block at a time), alternating in rounds.

    python -m benchmarks.tools.compositing_kernels [--rounds 4] [--calls 50] [--json out.json]

Cases: the octree step's batch (8192 rays of 256 samples, with depth), a KiloNeRF-like batch whose rays keep 0 to
256 samples after empty space is skipped, and a render pass of 640,000 rays of 64 samples. Per case and path: the
device time of one forward and one backward (CUDA events around `--calls` of each, issued back to back), and the
host's time to issue a forward and a backward (the same calls with the device idle beforehand, wall time). The
paths' outputs and gradients are compared once per case. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

CASES = {  # name: (rays, samples per ray: an int, or (lo, hi) drawn per ray)
    "octree step: 8192 rays x 256": (8192, 256),
    "KiloNeRF-like: 8192 rays x 0-256": (8192, (0, 256)),
    "render pass: 640000 rays x 64": (640000, 64),
}


def make_batch(rays: int, samples, device):
    g = torch.Generator().manual_seed(0)
    if isinstance(samples, int):
        counts = torch.full((rays,), samples, dtype=torch.int64)
    else:
        counts = torch.randint(samples[0], samples[1] + 1, (rays,), generator=g)
    offsets = torch.zeros(rays + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0).to(torch.int32)
    m = int(offsets[-1])
    sigma = torch.rand(m, generator=g) * 20
    deltas = torch.rand(m, generator=g) * 0.02 + 0.002
    rgb, t = torch.rand(m, 3, generator=g), torch.rand(m, generator=g) * 4
    return [x.to(device) for x in (sigma, rgb, deltas, t, offsets)]


def run_once(batch, weights):
    from tinn.render import composite
    sigma, rgb, deltas, t, offsets = batch
    leaves = [x.requires_grad_() for x in (sigma, rgb, deltas, t)]
    out = composite(leaves[0], leaves[1], leaves[2], offsets, background=(1.0, 1.0, 1.0), t=leaves[3])
    grads = torch.autograd.grad((out.rgb, out.opacity, out.depth), leaves, grad_outputs=weights)
    return out, grads


def timed(batch, weights, calls: int) -> tuple[float, float]:
    """(device ms, host ms) of one forward + backward."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        run_once(batch, weights)
    end.record()
    torch.cuda.synchronize()
    device_ms = start.elapsed_time(end) / calls
    host = []
    for _ in range(min(calls, 20)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_once(batch, weights)
        host.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return device_ms, sorted(host)[len(host) // 2] * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import tinn
    from tinn import settings
    if tinn.init() != "cuda":
        raise SystemExit("compositing_kernels measures CUDA launches: no GPU here")
    device = tinn.runtime.device()
    base = settings.installed()
    results = {}
    for name, (rays, samples) in CASES.items():
        batch = make_batch(rays, samples, device)
        g = torch.Generator(device=device).manual_seed(1)
        weights = (torch.randn(rays, 3, device=device, generator=g), torch.randn(rays, device=device, generator=g),
                   torch.randn(rays, device=device, generator=g))
        outputs = {}
        for path in ("taichi", "triton"):
            settings.install(base.replace(triton_render_kernels=path == "triton"))
            out, grads = run_once(batch, weights)
            outputs[path] = [out.rgb, out.opacity, out.depth, *grads]
        difference = max(float((a - b).detach().abs().max()) for a, b in zip(outputs["taichi"], outputs["triton"]))
        rows = {"taichi": [], "triton": []}
        for _ in range(args.rounds):
            for path in rows:
                settings.install(base.replace(triton_render_kernels=path == "triton"))
                rows[path].append(timed(batch, weights, args.calls))
        settings.install(base)
        results[name] = {"samples": int(batch[4][-1]), "max_abs_difference": difference,
                         **{path: {"device_ms": sorted(r[0] for r in runs)[len(runs) // 2],
                                   "host_ms": sorted(r[1] for r in runs)[len(runs) // 2]}
                            for path, runs in rows.items()}}
    print(f"compositing forward + backward on {torch.cuda.get_device_name(device)}, medians of {args.rounds} rounds")
    print("| case | samples | device ms, Taichi / Triton | host ms a call, Taichi / Triton | max abs difference |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['samples']:,} | {r['taichi']['device_ms']:.3f} / {r['triton']['device_ms']:.3f} | "
              f"{r['taichi']['host_ms']:.3f} / {r['triton']['host_ms']:.3f} | {r['max_abs_difference']:.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()

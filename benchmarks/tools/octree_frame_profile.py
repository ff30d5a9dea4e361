"""Where an octree frame's time goes: one mesh's octree built and trained as `octree_quality.py` builds it (the
budget of the KiloNeRF demo's full-size teacher), then a held-out frame timed and profiled (torch.profiler's CUDA
kernels, grouped by name), with early termination and empty-space skipping as rendered by default.

    python -m benchmarks.tools.octree_frame_profile --mesh duck --res 800 --seconds 10   (the kernel table on CUDA)
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

import tinn


def main(argv=None):
    from benchmarks.tools import octree_quality as oq

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mesh", default="duck", help="a name (bunny, duck, wuson) or a path")
    p.add_argument("--seconds", type=float, default=10.0, help="octree training time before the frame")
    p.add_argument("--top", type=int, default=14)
    p.add_argument("--segments", default=None,
                   help="comma list: the frame also timed with these early-termination runs (the first is profiled; "
                        "default: octree_quality.py's --octree-segments)")
    ours, rest = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        args = next(oq.variants(oq.parse_args(["--views", "100", "--test-views", "1", "--samples", "256",
                                               "--frequencies", "6", "--out", tmp] + rest)))  # lists: the first
        tinn.init(args.arch)
        demo = oq.load_file("demos/kilonerf.py")
        args.mesh, args.data = oq.MESHES.get(ours.mesh, ours.mesh), None
        train, test = demo.load_data(args)
    from tinn.render import seconds_per_frame
    from tinn.scenes.acceleration.octree_budget import single_grid_params
    from torch.profiler import ProfilerActivity, profile

    budget = single_grid_params(max(4 * train.width, 16))
    field = oq.octree_for(args, train, budget)
    oq.train_octree(args, field, train, ours.seconds)
    field.occupancy = field.build_occupancy(args.occupancy_res, args.samples, args.alpha_threshold)
    choices = [int(v) for v in ours.segments.split(",")] if ours.segments else [args.octree_segments]
    enc = field.encoding_config
    print(f"{os.path.basename(args.mesh)}: {field.n_nodes} nodes, {enc['n_levels']} levels x 2^"
          f"{enc['log2_hashmap_size']}")
    for segments in reversed(choices):  # the profiled one (the first) last, so `frame` is it
        render = {"segments": segments, "early_stop": args.early_stop}

        def frame(render=render):
            return field.render_image(test.c2w[0], test.width, test.height, test.focal, args.samples,
                                      background=test.background.float(), **render)

        seconds = seconds_per_frame(frame, 5)
        out = frame()
        print(f"  {segments} run(s): frame {1e3 * seconds:.2f} ms, {out['n_evaluated']} samples evaluated, "
              f"PSNR {float(-10 * torch.log10(((out['image'] - test.images[0].to(out['image'])) ** 2).mean())):.2f}")
    if tinn.runtime.arch() != "cuda":
        return  # the kernel table is CUDA's
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            frame()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:70]
            calls, us = rows.get(name, (0, 0.0))
            rows[name] = (calls + 1, us + e.device_time)
    total = sum(us for _, us in rows.values())
    print(f"{'kernel':<72s} {'calls':>5s} {'ms/frame':>9s} {'share':>6s}")
    for name, (calls, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:ours.top]:
        print(f"{name:<72s} {calls // 3:5d} {us / 3e3:9.3f} {100 * us / total:5.1f}%")
    print(f"{'all kernels':<72s} {'':5s} {total / 3e3:9.3f}")


if __name__ == "__main__":
    main()

"""Frame time of the octree LoD renderer against KiloNeRF's, same resolution and samples per ray, one process.

    python -m benchmarks.octree_render                        # full-size demos on a GPU (minutes)
    python -m benchmarks.octree_render --small --res 100 --samples 128   # CPU-sized training, 100 px frames
    python -m benchmarks.octree_render --data nerf_synthetic/lego --res 200

Trains both demos (`demos/kilonerf.py`, `demos/octree_lod.py`) with the same images size and samples per
ray, then prints their render times: KiloNeRF with its occupancy grid; the octree with its per-depth
occupancy grids and early ray termination, and with every sample evaluated. JSON in --out.
"""
from __future__ import annotations

import argparse
import json
import os


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="CPU-sized training of both scenes")
    p.add_argument("--data", default=None, help="a NeRF-synthetic scene folder for both")
    p.add_argument("--res", type=int, default=None, help="image side in pixels (both)")
    p.add_argument("--samples", type=int, default=128, help="samples per ray (both)")
    p.add_argument("--quick", action="store_true", help="toy scenes and a few steps: checks the benchmark, not the speed")
    p.add_argument("--out", default="out/octree_render")
    p.add_argument("--json", default=None, help="the results here (default: octree_render.json in --out)")
    args = p.parse_args(argv)

    from benchmarks.loading import load_file
    kilonerf = load_file("demos/kilonerf.py")
    octree_lod = load_file("demos/octree_lod.py")
    import torch

    common = (["--small"] if args.small else []) + (["--data", args.data] if args.data else []) \
        + (["--res", str(args.res)] if args.res else []) + ["--samples", str(args.samples)]
    kilo_quick = octree_quick = []
    if args.quick:
        args.samples = min(args.samples, 16)
        common = ["--small", "--res", str(args.res or 8), "--samples", str(args.samples), "--views", "2",
                  "--test-views", "1"]
        kilo_quick = ["--grid", "2", "--teacher-steps", "2", "--distill-steps", "2", "--finetune-steps", "2",
                      "--batch-rays", "64", "--finetune-rays", "64", "--distill-batch", "256", "--occupancy-res", "8"]
        octree_quick = ["--steps", "2", "--batch", "64", "--pyramid-levels", "1"]
    threads = torch.get_num_threads()
    kilo = kilonerf.run(common + kilo_quick + ["--out", os.path.join(args.out, "kilonerf")])
    torch.set_num_threads(1 if kilo["arch"] == "cpu" else threads)  # as the KiloNeRF demo renders on the CPU
    octree = octree_lod.run(common + octree_quick + ["--out", os.path.join(args.out, "octree")])
    torch.set_num_threads(threads)
    kilo_ms = kilo["render_ms_per_frame"]["student"]
    result = {"arch": kilo["arch"], "res": kilo["res"], "samples": args.samples,
              "kilonerf_ms": kilo_ms, "octree_ms": 1e3 * octree["render_seconds"],
              "octree_every_sample_ms": 1e3 * octree["render_seconds_every_sample"],
              "psnr_kilonerf": kilo["psnr_student"], "psnr_octree": octree["psnr"]}
    result["octree_over_kilonerf_fps"] = kilo_ms / result["octree_ms"]
    json_path = args.json or os.path.join(args.out, "octree_render.json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    w, h = result["res"]
    print(f"{w}x{h}, {args.samples} samples/ray on {result['arch']}: KiloNeRF {kilo_ms:.1f} ms/frame, octree "
          f"{result['octree_ms']:.1f} ms (every sample {result['octree_every_sample_ms']:.1f} ms); octree fps / "
          f"KiloNeRF fps = {result['octree_over_kilonerf_fps']:.2f}; PSNR KiloNeRF {result['psnr_kilonerf']:.2f} dB, "
          f"octree {result['psnr_octree']:.2f} dB")
    return result


if __name__ == "__main__":
    main()

"""Where an octree training step spends its time: host, device, synchronisations and kernels.

    python -m benchmarks.tools.octree_step_profile --mesh .meshes/bunny.obj --res 800 --views 100 --samples 256 \
        --batch-rays 8192 --frequencies 6 [--steps 30] [--host-profile] [--json out.json]

Builds the octree `benchmarks/tools/octree_quality.py` trains (the budgeted tree over the training views' hull, the
budget a single 16-level grid of 2^19 entries, as the KiloNeRF teacher's; that tool's octree options apply),
takes `--warmup` steps, then prints `scene_step_profile`'s measurements of its `OctreeTrainer` step: wall time per
step issued back to back and with a sync after each, the calls that wait for the device, the device time per
kernel and the device's busy time (the rest of a step is the device waiting for the host), and with
`--host-profile` the host's time by Python function. CUDA only.
"""
from __future__ import annotations

import argparse
import sys

import tinn  # noqa: E402
from benchmarks.common import host_profile, write_json  # noqa: E402
from benchmarks.loading import load_file  # noqa: E402
from benchmarks.tools.scene_step_profile import measure_step  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--host-profile", action="store_true", help="also the host's time by Python function")
    p.add_argument("--json", default=None)
    ours, rest = p.parse_known_args(argv)
    quality = load_file("benchmarks/tools/octree_quality.py")
    args = quality.parse_args(rest)
    if tinn.init() != "cuda":
        sys.exit("octree_step_profile needs CUDA (torch.profiler's CUDA trace)")
    demo = load_file("demos/kilonerf.py")
    train, _ = demo.load_data(args)
    variant = next(quality.variants(args))
    budget = quality.single_grid_budget(args, train)
    field = quality.octree_for(variant, train, budget)
    trainer = quality.octree_trainer(variant, field, train, total_steps=None)
    print(f"octree: {field.n_nodes} nodes {field.octree.nodes_per_level()}, {field.n_params()} params (budget "
          f"{budget}), {train.width}x{train.height}, {len(train)} views, {trainer.batch_rays} rays x "
          f"{trainer.n_samples} samples a step")
    for _ in range(ours.warmup):  # compiles, and lets the field leave its start
        trainer.step()
    r = measure_step(trainer.step, ours.steps, ours.top)
    kernels, busy = r["kernels"], r["device_busy_ms"]
    print(f"{r['pipelined_ms']:.2f} ms/step pipelined, {r['synced_ms']:.2f} synced each step, device busy "
          f"{busy:.2f} ms; {len(r['syncs'])} host syncs per step")
    for message in r["syncs"]:
        print(f"   sync: {message}")
    for name, calls, ms in kernels:
        print(f"   {name[:72]:72s} {calls:5.1f} {ms:8.3f}")
    if ours.host_profile:
        r.update(host_profile(trainer.step, ours.steps, ours.top, indent="   ", max_launches=10))
    write_json(ours.json, r)
    return r


if __name__ == "__main__":
    main()

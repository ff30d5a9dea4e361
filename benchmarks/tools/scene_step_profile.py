"""Where a KiloNeRF training step spends its time: host, device, synchronisations and kernels, per phase.

    python -m benchmarks.tools.scene_step_profile [--phases distill,finetune] [--steps 20] [demo options...]
    TINN_SETTINGS=precision=float32 python -m benchmarks.tools.scene_step_profile --mesh bunny.obj --res 800

Builds `demos/kilonerf.py`'s pipeline with the demo's options (anything this tool does not know goes to the
demo), runs the phases before the profiled ones for a few steps (`--prep-steps`), then for each phase in
`--phases`:
1. wall time per step over `--steps` steps issued back to back (one device sync at the end), and the same with
   a sync after every step (if the two are close, the host is the bottleneck or the step synchronises);
2. the host synchronisations of one step (torch's sync debug mode: each call that waits for the device);
3. the device time per kernel over the steps (torch.profiler's CUDA trace), top `--top`, and the device's busy
   time per step; the difference to the wall time is time the device waited for the host;
4. with `--host-profile`, the host's time per step by Python function (cProfile, top `--top` by own time, and
   the calls of one step that wait for the device, found by keeping the device busy first
   (`benchmarks.common.waiting_calls`: every wait, not only torch's)): where a host-bound step's time goes.

Run it once per precision (`TINN_SETTINGS=precision=...`) to compare the paths. CUDA only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import torch

import tinn  # noqa: E402
from benchmarks.common import host_profile  # noqa: E402
from benchmarks.loading import load_file  # noqa: E402


def wall_ms(step, steps: int, sync_each: bool) -> float:
    tinn.runtime.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
        if sync_each:
            tinn.runtime.sync()
    tinn.runtime.sync()
    return 1e3 * (time.perf_counter() - t0) / steps


def host_syncs(step) -> list[str]:
    """The messages of torch's sync debug mode for one step (each is a call that waited for the device)."""
    tinn.runtime.sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(c.message)[:160] for c in caught if "called a synchronizing" in str(c.message)]


def kernel_table(step, steps: int, top: int) -> tuple[list[tuple[str, int, float]], float]:
    """[(kernel, calls per step, device ms per step)] of the `top` costliest, and the device's busy ms per step."""
    from torch.profiler import ProfilerActivity, profile

    tinn.runtime.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        tinn.runtime.sync()
    rows = []
    for e in prof.key_averages():
        device_us = getattr(e, "device_time_total", None)
        if device_us is None:
            device_us = e.cuda_time_total
        if device_us > 0 and e.count > 0:
            rows.append((e.key, e.count / steps, device_us / 1e3 / steps))
    rows.sort(key=lambda r: -r[2])
    return rows[:top], sum(r[2] for r in rows)


def measure_step(step, steps: int, top: int) -> dict:
    """A step's wall ms issued back to back and synced after each, the host syncs of one step (`host_syncs`), and
    `kernel_table`'s `top` kernels and device busy ms per step."""
    r = {"pipelined_ms": wall_ms(step, steps, False), "synced_ms": wall_ms(step, steps, True),
         "syncs": host_syncs(step)}
    r["kernels"], r["device_busy_ms"] = kernel_table(step, steps, top)
    return r


def compiled_variants() -> dict[str, int]:
    """Compiled variants of each tensor-core kernel so far (a count that grows during training is a JIT pause)."""
    from tinn.kernels.tensor_cores import mlp

    counts = {}
    for name in ("forward_kernel", "forward_kernel_any_batch", "backward_kernel", "backward_kernel_any_batch"):
        caches = getattr(getattr(mlp, name), "device_caches", {})
        counts[name] = sum(len(entry[0]) for entry in caches.values())
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", default="distill,finetune", help="phases to profile, of: teacher, distill, finetune")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prep-steps", type=int, default=200, help="steps of each earlier phase before profiling")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--host-profile", action="store_true", help="also the host's time by Python function")
    p.add_argument("--json", default=None)
    args, demo_argv = p.parse_known_args(argv)
    arch = tinn.init()
    if arch != "cuda":
        sys.exit("scene_step_profile needs CUDA (torch.profiler's CUDA trace)")
    demo = load_file("demos/kilonerf.py")
    wanted = [s.strip() for s in args.phases.split(",") if s.strip()]
    order = ["teacher", "distill", "finetune"]
    bad = [w for w in wanted if w not in order]
    if bad:
        sys.exit(f"--phases: {bad} not among {order}")
    steps = {k: max(args.prep_steps, args.steps * 3 + 10) for k in order}
    demo_args = demo.parse_args(demo_argv + [f"--{k}-steps={steps[k]}" for k in order])
    demo_args.batch_seed = demo_args.seed
    train, test = demo.load_data(demo_args)
    pipe = demo.KiloNeRFPipeline(demo_args, train, test)
    settings = tinn.runtime.settings()
    print(f"KiloNeRF {pipe.student.n_networks} networks, {train.width}x{train.height}, student path "
          f"{getattr(pipe.student, 'network', pipe.student)!r:.200}; settings {settings}")
    results = {}
    for phase in order:
        if pipe.phase != phase:
            continue
        if phase in wanted:
            trainer = pipe.trainers[phase]
            for _ in range(3):  # compiles
                trainer.step()
            r = measure_step(trainer.step, args.steps, args.top)
            kernels, busy = r["kernels"], r["device_busy_ms"]
            r["compiled_variants"] = compiled_variants()
            results[phase] = r
            print(f"\n== {phase}: {r['pipelined_ms']:.2f} ms/step pipelined, {r['synced_ms']:.2f} synced each step, "
                  f"device busy {busy:.2f} ms; {len(r['syncs'])} host syncs per step")
            print(f"   compiled tensor-core kernel variants so far: {r['compiled_variants']}")
            for name, calls, ms in kernels:
                print(f"   {name[:72]:72s} {calls:5.1f} {ms:8.3f}")
            if args.host_profile:
                r.update(host_profile(trainer.step, args.steps, args.top, indent="   ", max_launches=8))
        pipe.run_phase()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

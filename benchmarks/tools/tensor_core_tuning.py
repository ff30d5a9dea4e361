"""Where a tensor-core training step spends its time, and which launch options each kernel runs fastest with.

    python3 -m benchmarks.tools.tensor_core_tuning [--cases 4096:64,4096:128,64:64] [--log2-samples 22]
        [--precision float16] [--sweep] [--json out/tensor_core_tuning.json]

Per case (NETWORKS:WIDTH; 32 in, two hidden layers, 16 out, ReLU, ragged routing as tensor_core_check makes it):
1. grouping the ids (tinn.routing's sort), the same with the tiles of a training step, the array's inference
   (routing, weight packing, kernel);
2. the Trainer's step (L2 loss, Adam) in the precision, with the GPU time of every kernel of one step from
   torch.profiler (so the time outside the MLP kernels is named);
3. with --sweep: each kernel (inference, forward that saves, backward to the weights, backward to inputs and
   weights, and both backwards recomputing the forward) under every launch option (samples per block, warps,
   pipeline stages) and the backward under several chunk lengths, CUDA events, median of the repetitions. The fastest option per kernel is printed last.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import torch

import tinn

from benchmarks.common import gpu_ms
from benchmarks.tools.tensor_core_check import make_ids


# The sweep's kernels and the names launch.launch_options knows them by.
SWEPT = {"inference": "inference", "forward_save": "forward", "backward_params": "backward",
         "backward_all": "backward_dx", "recompute_params": "recompute", "recompute_all": "recompute_dx"}


def step_profile(net, batch: int, n_networks: int, steps: int) -> dict:
    """Wall ms per Trainer step (blocks of `steps`, one sync each) and the GPU ms per kernel of one step."""
    from torch.profiler import ProfilerActivity, profile

    from tinn.trainer import Trainer
    trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam"})
    gen = torch.Generator().manual_seed(2)
    x, y = torch.rand(batch, 32, device="cuda"), torch.rand(batch, 16, device="cuda")
    ids = make_ids("ragged", batch, n_networks, gen)
    with tinn.checks.disabled():
        for _ in range(3):
            trainer.training_step(x, y, ids)
        torch.cuda.synchronize()
        walls = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(steps):
                trainer.training_step(x, y, ids)
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3 / steps)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                trainer.training_step(x, y, ids)
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = sorted(({"kernel": e.key[:70], "calls": e.count / steps, "ms": e.device_time_total / 1e3 / steps}
                      for e in events), key=lambda r: -r["ms"])
    return {"wall_ms": statistics.median(walls), "gpu_busy_ms": sum(k["ms"] for k in kernels), "kernels": kernels,
            "skipped_steps": trainer.skipped_steps}


def host_profile(fn, calls: int = 20, top: int = 14) -> list[dict]:
    """The host's time per call by op (self CPU time, torch.profiler): where a call spends its launches."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    return [{"op": e.key[:60], "calls": e.count / calls, "self_us": e.self_cpu_time_total / calls} for e in ops[:top]]


def sweep(tc, net, batch: int, n_networks: int, precision: str, reps: int, kernels=tuple(SWEPT),
          only_options=None) -> list[dict]:
    """Each kernel (of `kernels`, SWEPT's names) under each launch option (or those of `only_options`, a list of
    (block, warps, stages)); the backward under each chunk length (default options)."""
    from tinn.kernels.tensor_cores import launch
    from tinn.routing import route_fused
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(batch, 32, device="cuda")
    ids = make_ids("ragged", batch, n_networks, gen)
    dy = torch.randn(batch, 16, device="cuda") / (batch * 16)
    params = net.params.detach()
    packed = tc.pack_weights(params, net.shape, precision)
    widest = max(net.width, 32)
    blocks = (64, 128, 256) if widest <= 64 else (32, 64, 128)
    options = [launch.LaunchOptions(bm, w, s) for bm, w, s in itertools.product(blocks, (4, 8), (1, 2, 3))
               if not (bm == 256 and w == 4)]
    if only_options:
        options = [launch.LaunchOptions(*o) for o in only_options]
    original = launch.launch_options
    rows = []
    try:
        for opt in options:
            launch.launch_options = lambda *a, _o=opt, **k: _o
            tiles, chunks = route_fused(ids, n_networks, (opt.block_m, 1024))
            row = {"options": list(opt)}
            try:
                if "inference" in kernels:
                    row["inference"] = gpu_ms(lambda: tc.forward(x, False, tiles, packed, net.shape), reps)
                if "forward_save" in kernels:
                    row["forward_save"] = gpu_ms(lambda: tc.forward(x, False, tiles, packed, net.shape, save=True),
                                                 reps)
                if {"backward_params", "backward_all"} & set(kernels):
                    _, saved = tc.forward(x, False, tiles, packed, net.shape, save=True)
                    for name, want_dx in (("backward_params", False), ("backward_all", True)):
                        if name in kernels:
                            row[name] = gpu_ms(lambda: tc.backward(dy, saved, chunks, want_dx=want_dx), reps)
                    del saved
                if {"recompute_params", "recompute_all"} & set(kernels) and tc.recomputes(net.shape):
                    _, kept = tc.forward(x, False, tiles, packed, net.shape, save=True, recompute=True)
                    for name, want_dx in (("recompute_params", False), ("recompute_all", True)):
                        if name in kernels:
                            row[name] = gpu_ms(lambda: tc.backward(dy, kept, chunks, want_dx=want_dx), reps)
                    del kept
            except Exception as e:  # out of shared memory or registers for this option
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
            print("  ", row, flush=True)
    finally:
        launch.launch_options = original
    tile = tc.default_block_m(torch.device("cuda"))
    for chunk in (256, 512, 1024, 2048, 4096, 8192) if "backward_params" in kernels else ():
        tiles, chunks = route_fused(ids, n_networks, (tile, chunk))
        _, saved = tc.forward(x, False, tiles, packed, net.shape, save=True)
        row = {"chunk": chunk, "backward_params": gpu_ms(lambda: tc.backward(dy, saved, chunks, want_dx=False), reps)}
        del saved
        if tc.recomputes(net.shape):
            _, kept = tc.forward(x, False, tiles, packed, net.shape, save=True, recompute=True)
            row["recompute_params"] = gpu_ms(lambda: tc.backward(dy, kept, chunks, want_dx=False), reps)
            del kept
        rows.append(row)
        print("  ", row, flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="4096:64,4096:128,64:64")
    p.add_argument("--log2-samples", type=int, default=22)
    p.add_argument("--precision", default="float16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sweep-kernels", default=",".join(SWEPT), help=f"the sweep's kernels, of {list(SWEPT)}")
    p.add_argument("--sweep-options", default=None,
                   help="only these launch options, BLOCK:WARPS:STAGES comma-separated (default: the full grid)")
    p.add_argument("--host-profile", action="store_true", help="the host's time per inference call, by op")
    p.add_argument("--json", default=os.path.join("out", "tensor_core_tuning.json"))
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("tensor_core_tuning.py needs CUDA")
    from tinn import routing
    from tinn.kernels import tensor_cores as tc
    from tinn.networks import NetworkArray
    batch = 1 << args.log2_samples
    results = {"device": torch.cuda.get_device_name(), "precision": args.precision, "cases": []}
    summary = []
    for case in args.cases.split(","):
        n, width = (int(v) for v in case.split(":"))
        cfg = {"n_neurons": width, "n_hidden_layers": 2}
        net = NetworkArray(32, 16, cfg, n_networks=n, precision=args.precision)
        ids = make_ids("ragged", batch, n, torch.Generator().manual_seed(3))
        entry = {"networks": n, "width": width, "path": net.path, "precision": net.precision}
        from tinn.kernels.tensor_cores import launch
        entry["default_options"] = {
            name: list(launch.launch_options(tc.Geometry.of(net.shape), args.precision, torch.device("cuda"),
                                             kernel=kernel)) for name, kernel in SWEPT.items()}
        x = torch.rand(batch, 32, device="cuda")

        def infer():
            with torch.no_grad(), tinn.checks.disabled():
                net(x, ids)
        entry["grouping_ms"] = gpu_ms(lambda: routing.sort_by_network(ids, n))
        entry["tiles_ms"] = gpu_ms(lambda: routing.route_fused(ids, n, (128, 1024)))
        entry["inference_ms"] = gpu_ms(infer)
        entry["step"] = step_profile(net, batch, n, args.steps)
        if args.host_profile:
            entry["inference_host"] = host_profile(infer)
            print(f"   host time per inference call, by op (self, us): " + ", ".join(
                f"{r['op']} x{r['calls']:g} {r['self_us']:.0f}" for r in entry["inference_host"]))
        print(f"== {n} x {width} {net.path} {net.precision}, 2^{args.log2_samples} ragged: grouping "
              f"{entry['grouping_ms']:.3f} ms, with tiles {entry['tiles_ms']:.3f} ms, inference "
              f"{entry['inference_ms']:.3f} ms, step {entry['step']['wall_ms']:.3f} ms")
        for k in entry["step"]["kernels"][:14]:
            print(f"   {k['kernel']:70s} {k['calls']:5.1f} {k['ms']:8.3f}")
        if args.sweep:
            only = [tuple(int(v) for v in o.split(":")) for o in args.sweep_options.split(",")] \
                if args.sweep_options else None
            entry["sweep"] = sweep(tc, net, batch, n, args.precision, args.reps, args.sweep_kernels.split(","), only)
            for kernel in SWEPT:
                timed = [r for r in entry["sweep"] if "options" in r and kernel in r]
                if not timed:
                    continue
                best = min(timed, key=lambda r: r[kernel])
                default = [r for r in timed if r["options"] == entry["default_options"][kernel]]
                summary.append((case, kernel, best["options"], best[kernel],
                                default[0][kernel] if default else float("nan")))
            chunks = [r for r in entry["sweep"] if "chunk" in r]
            if chunks:
                best = min(chunks, key=lambda r: r["backward_params"])
                at_1024 = [r for r in chunks if r["chunk"] == 1024][0]
                summary.append((case, "backward chunk", best["chunk"], best["backward_params"],
                                at_1024["backward_params"]))
        results["cases"].append(entry)
        del net
        torch.cuda.empty_cache()
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\n{results['device']}, {args.precision}")
    print(f"{'case':10s} {'grouping':>9s} {'+ tiles':>8s} {'inference':>10s} {'step':>8s} {'GPU busy':>9s}")
    for e in results["cases"]:
        print(f"{e['networks']}:{e['width']:<6d} {e['grouping_ms']:9.3f} {e['tiles_ms']:8.3f} "
              f"{e['inference_ms']:10.3f} {e['step']['wall_ms']:8.3f} {e['step']['gpu_busy_ms']:9.3f}")
    for case, kernel, opt, ms, default_ms in summary:
        print(f"best {case:9s} {kernel:16s} {str(opt):16s} {ms:.3f} ms (default {default_ms:.3f} ms)")


if __name__ == "__main__":
    main()

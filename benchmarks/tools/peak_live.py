"""The CUDA buffers alive at the peak of one MLP-array training step, tinn against the torch bmm baseline.

    python -m benchmarks.tools.peak_live --networks 64 --width 128 --log2-samples 22

Replays torch's allocator trace (`torch.cuda.memory._record_memory_history`) of one steady-state step
(after two warm-up steps) and prints, at the moment the allocated bytes peak, every live block with the
first frame of tinn's, the benchmark's or torch's Python code that allocated it. CUDA only.
"""
from __future__ import annotations

import argparse
import gc
import os

import torch


import tinn  # noqa: E402

MIB = float(1 << 20)


def where(frames) -> str:
    """The innermost frame in tinn, the benchmarks or torch's Python code (file:line function)."""
    for f in frames:
        name = f.get("filename", "")
        if name.endswith(".py") and ("tinn" in name or "benchmarks" in name or "torch/optim" in name
                                     or "torch/nn" in name or "autograd" in name):
            return f"{os.path.basename(name)}:{f.get('line')} {f.get('name')}"
    return next((f"{os.path.basename(f.get('filename', '?'))}:{f.get('line')} {f.get('name')}" for f in frames
                 if f.get("filename", "").endswith(".py")), "?")


def live_now(label: str) -> None:
    """The blocks allocated now, by allocating frame (those allocated while history was recorded)."""
    snap = torch.cuda.memory._snapshot()
    rows = {}
    for seg in snap["segments"]:
        for blk in seg["blocks"]:
            if blk["state"] == "active_allocated":
                key = where(blk.get("frames", []))
                n, b = rows.get(key, (0, 0))
                rows[key] = (n + 1, b + blk["size"])
    print(f"\n== {label}: {torch.cuda.memory_allocated() / MIB:.1f} MiB allocated")
    for key, (n, b) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        if b >= 1 << 16:
            print(f"  {b / MIB:10.2f} MiB  {n:3d} block(s)  {key}")


def live_at_peak(step, label: str) -> None:
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, cur, peak, at_peak = {}, 0, 0, {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > peak:
                peak, at_peak = cur, dict(live)
        elif e["action"] in ("free_requested",) and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]
    print(f"\n== {label}: before the step {base / MIB:.1f} MiB allocated; the step adds at most {peak / MIB:.1f} MiB "
          f"(peak {(base + peak) / MIB:.1f} MiB)")
    rows = {}
    for e in at_peak.values():
        key = where(e.get("frames", []))
        n, b = rows.get(key, (0, 0))
        rows[key] = (n + 1, b + e["size"])
    for key, (n, b) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        if b >= 1 << 16:
            print(f"  {b / MIB:10.2f} MiB  {n:3d} block(s)  {key}")


def earlier_case(n: int, width: int, batch: int, routing: str, dev) -> None:
    """A benchmark case run to completion (inference, training steps), its objects dropped on return."""
    from benchmarks.bench_mlp_array import make_ids
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(32, 16, cfg, n_networks=n)
    x, target = torch.rand(batch, 32, device=dev), torch.rand(batch, 16, device=dev)
    ids = make_ids(batch, n, routing, dev)
    with tinn.checks.disabled():
        net.inference(x, ids)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-3})
        for _ in range(3):
            trainer.training_step(x, target, ids)
    torch.cuda.synchronize()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=64)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--log2-samples", type=int, default=22)
    p.add_argument("--routing", default="even")
    p.add_argument("--before", default=None, metavar="N,W",
                   help="first train another case (networks N, width W) in this process, as the benchmark's "
                        "earlier cases do; lists what it leaves allocated")
    p.add_argument("--inference-first", action="store_true",
                   help="as the benchmark: inference calls before the training steps; lists what is allocated "
                        "before the measured step")
    args = p.parse_args(argv)
    tinn.init("cuda")
    from benchmarks.bench_mlp_array import TorchBmmArray, make_ids
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    batch = 1 << args.log2_samples
    if args.before:
        torch.cuda.memory._record_memory_history(max_entries=400_000)
        n0, w0 = (int(v) for v in args.before.split(","))
        earlier_case(n0, w0, batch, args.routing, dev)
        gc.collect()
        live_now(f"after the earlier case {n0} x {w0}")
    cfg = {"otype": "FullyFusedMLP", "n_neurons": args.width, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(32, 16, cfg, n_networks=args.networks)
    x = torch.rand(batch, 32, device=dev)
    target = torch.rand(batch, 16, device=dev)
    ids = make_ids(batch, args.networks, args.routing, dev)
    with tinn.checks.disabled():
        if args.inference_first:
            torch.cuda.memory._record_memory_history(max_entries=200_000)
            for _ in range(3):
                net.inference(x, ids)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-3})
        for _ in range(2):
            trainer.training_step(x, target, ids)
        if args.inference_first:
            gc.collect()
            live_now("tinn, before the measured step")
            torch.cuda.memory._record_memory_history(enabled=None)
        live_at_peak(lambda: trainer.training_step(x, target, ids), "tinn")
    del trainer
    model = TorchBmmArray(net).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.mean((model(x, ids.long(), args.networks) - target) ** 2)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    live_at_peak(step, "torch bmm")


if __name__ == "__main__":
    main()

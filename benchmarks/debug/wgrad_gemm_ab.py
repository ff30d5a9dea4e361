"""A single network's weight-gradient GEMMs (dW = D @ H^T, K = batch) in a few torch formulations, timed on CUDA.

    python benchmarks/debug/wgrad_gemm_ab.py [--log2-batch 18]

Shapes of the image config (32 -> 64 -> 64 -> 3): D is a (fan_out, batch) row block of the feature-major
deltas, H the layer input, either feature-major (fan_in, batch) or row-major (batch, fan_in).
Variants: one torch.mm; the batch split into S slices as one torch.bmm plus a sum over slices.
"""
import argparse

import torch


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--log2-batch", type=int, default=18)
    args = p.parse_args()
    b = 1 << args.log2_batch
    dev = "cuda"
    rows = []
    for fan_out, fan_in in ((64, 32), (64, 64), (3, 64)):
        deltas = torch.randn(64, b, device=dev)[:fan_out]
        h_fm = torch.randn(fan_in, b, device=dev)
        h_rm = torch.randn(b, fan_in, device=dev)
        out = torch.empty(fan_out, fan_in, device=dev)
        ref = (deltas.double() @ h_fm.double().t()).float()
        variants = {"mm fm": lambda: torch.mm(deltas, h_fm.t(), out=out),
                    "mm rm": lambda: torch.mm(deltas, h_rm, out=out)}
        for s in (16, 64, 256):
            def split(s=s):
                d = deltas.reshape(fan_out, s, b // s).transpose(0, 1)          # (S, fan_out, b/S)
                h = h_fm.reshape(fan_in, s, b // s).permute(1, 2, 0)           # (S, b/S, fan_in)
                torch.sum(torch.bmm(d, h), 0, out=out)
            variants[f"bmm S={s}"] = split
        for name, fn in variants.items():
            ms = timed(fn)
            fn()
            err = float((out - (ref if "rm" not in name else (deltas.double() @ h_rm.double()).float())).abs().max())
            rows.append((f"{fan_out}x{fan_in}", name, ms, 2 * fan_out * fan_in * b / ms / 1e9, err))
    print(f"{'shape':8s} {'variant':10s} {'ms':>8s} {'TF/s':>7s} {'max err':>9s}")
    for r in rows:
        print(f"{r[0]:8s} {r[1]:10s} {r[2]:8.4f} {r[3]:7.2f} {r[4]:9.2e}")


if __name__ == "__main__":
    main()

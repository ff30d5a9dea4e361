"""Does Taichi 1.7.4's f16 path pay on this GPU? The three operations a half-precision tinn would lean on,
each in f32 and f16, timed in the same run:

  gather   hash-grid style lookups: random reads of 4 corners x 2 features from a 2^22-entry table
  atomic   hash-grid backward style: random atomic adds into that table
  fma      MLP style register arithmetic: a long chain of multiply-adds per thread

    python benchmarks/tools/f16_probe.py [--json out.json]

Prints ms per launch and f16/f32 for each; also the max |f16 - f32| of the gather (accuracy of storage).
"""
import argparse
import json
import time

import taichi as ti
import torch

N_TABLE = 1 << 22
N_SAMPLES = 1 << 22
FMA_STEPS = 256


def make_kernels(dt):
    @ti.kernel
    def gather(table: ti.types.ndarray(dtype=dt, ndim=1), idx: ti.types.ndarray(dtype=ti.i32, ndim=2),
               out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        for b in range(idx.shape[0]):
            acc = 0.0
            for c in ti.static(range(4)):
                e = idx[b, c] * 2
                acc += ti.cast(table[e], ti.f32) + ti.cast(table[e + 1], ti.f32)
            out[b] = acc

    @ti.kernel
    def scatter(table: ti.types.ndarray(dtype=dt, ndim=1), idx: ti.types.ndarray(dtype=ti.i32, ndim=2)):
        for b in range(idx.shape[0]):
            for c in ti.static(range(4)):
                e = idx[b, c] * 2
                ti.atomic_add(table[e], ti.cast(1e-3, dt))
                ti.atomic_add(table[e + 1], ti.cast(1e-3, dt))

    @ti.kernel
    def fma(out: ti.types.ndarray(dtype=ti.f32, ndim=1)):
        for b in range(out.shape[0]):
            a = ti.cast(b % 7, dt) * ti.cast(0.01, dt)
            x = ti.cast(0.5, dt)
            y = ti.cast(0.25, dt)
            for _ in range(FMA_STEPS):
                x = x * a + y
                y = y * a + x
            out[b] = ti.cast(x + y, ti.f32)

    return gather, scatter, fma


def timed(fn, *args, reps=20):
    fn(*args)
    ti.sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(*args)
    ti.sync()
    return (time.perf_counter() - t0) * 1e3 / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json", default=None)
    args = p.parse_args()
    ti.init(arch=ti.cuda if torch.cuda.is_available() else ti.cpu)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = N_SAMPLES if dev == "cuda" else 1 << 16
    gen = torch.Generator(device="cpu").manual_seed(0)
    idx = torch.randint(0, N_TABLE, (n, 4), generator=gen, dtype=torch.int32).to(dev)
    values = torch.rand(2 * N_TABLE, generator=gen).to(dev)
    rows, outs = {}, {}
    for name, dt, tdt in (("f32", ti.f32, torch.float32), ("f16", ti.f16, torch.float16)):
        gather, scatter, fma = make_kernels(dt)
        table = values.to(tdt)
        out = torch.empty(n, device=dev)
        rows[f"gather {name}"] = timed(gather, table, idx, out)
        outs[name] = out.clone()
        rows[f"atomic {name}"] = timed(scatter, table.clone(), idx)
        rows[f"fma {name}"] = timed(fma, out)
    err = float((outs["f16"] - outs["f32"]).abs().max())
    print(f"{'op':8s} {'f32 ms':>8s} {'f16 ms':>8s} {'f16/f32':>8s}")
    for op in ("gather", "atomic", "fma"):
        a, b = rows[f"{op} f32"], rows[f"{op} f16"]
        print(f"{op:8s} {a:8.3f} {b:8.3f} {b / a:8.2f}")
    print(f"gather max |f16 - f32| = {err:.2e} (sums of 8 values in [0, 1))")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ms": rows, "gather_max_abs_err": err, "device": dev}, f, indent=1)


if __name__ == "__main__":
    main()

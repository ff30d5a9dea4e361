"""Host cost of one launch by argument count, in one process: Taichi's standard and tinn's lean path
(`tinn/kernels/launch.py`) by tensor and scalar arguments, with the lean path's context-and-arguments part alone;
a Triton kernel through its JIT dispatch and through its compiled kernel called directly (CUDA); a few torch ops.
Prints us per call (tight loops on an idle device: a step's launches, interleaved with other work, cost more).

    python -m benchmarks.tools.launch_cost [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import torch

import tinn  # noqa: E402
from benchmarks.common import sync, write_json  # noqa: E402

TAICHI_CASES = ((1, 0), (4, 0), (8, 0), (16, 0), (24, 0), (4, 8), (4, 16))


def per_call(fn, n: int = 3000) -> float:
    for _ in range(50):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    return (t1 - t0) / n * 1e6


def taichi_kernel(n_tensors: int, n_scalars: int):
    """A one-iteration Taichi kernel of n_tensors float32 arrays and n_scalars floats, from a generated module
    (Taichi reads a kernel's source from its file)."""
    args = [f"a{i}: A" for i in range(n_tensors)] + [f"s{i}: ti.f32" for i in range(n_scalars)]
    terms = [f"a{i}[0]" for i in range(1, n_tensors)] + [f"s{i}" for i in range(n_scalars)]
    source = ("from tinn.backend import ti\nA = ti.types.ndarray(dtype=ti.f32, ndim=1)\n\n\n@ti.kernel\n"
              f"def k({', '.join(args)}):\n    for i in range(1):\n        a0[0] += {' + '.join(terms) or '0.0'}\n")
    name = f"launch_cost_k{n_tensors}_{n_scalars}"
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.k


def taichi_rows(dev) -> list[tuple[str, float]]:
    from tinn.kernels.launch import fast_kernel
    rows = []
    for n_tensors, n_scalars in TAICHI_CASES:
        kernel = taichi_kernel(n_tensors, n_scalars)
        lean = fast_kernel(kernel)
        args = [torch.zeros(64, device=dev) for _ in range(n_tensors)] + [0.5] * n_scalars
        what = f"{n_tensors} tensors, {n_scalars} scalars"
        rows.append((f"Taichi standard launch, {what}", per_call(lambda: kernel(*args), 1000)))
        rows.append((f"Taichi lean launch, {what}", per_call(lambda: lean(*args))))
        t_kernel, _ = next(iter(lean.instances.values()))

        def context_and_arguments():
            ctx = t_kernel.make_launch_context()
            for slot, kind, i in lean.slots:
                a = args[i]
                if isinstance(a, torch.Tensor):
                    ctx.set_arg_external_array_with_shape(slot, a.data_ptr(), a.nbytes, a.shape, 0)
                else:
                    ctx.set_arg_float(slot, a)
            return ctx
        rows.append(("  its context and arguments alone", per_call(context_and_arguments)))
    return rows


def triton_rows() -> list[tuple[str, float]]:
    import triton
    import triton.language as tl

    @triton.jit
    def add4(a, b, c, d, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(a + i, tl.load(b + i, mask=m) + tl.load(c + i, mask=m) + tl.load(d + i, mask=m), mask=m)

    @triton.jit
    def add16(a, b, c, d, e, f, g, h, p, q, r, s, t, u, v, w, n, x0, x1, x2, x3, x4, x5, x6, x7,
              BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        acc = tl.load(b + i, mask=m) + tl.load(c + i, mask=m) + tl.load(d + i, mask=m) + tl.load(e + i, mask=m)
        acc += tl.load(f + i, mask=m) + tl.load(g + i, mask=m) + tl.load(h + i, mask=m) + tl.load(p + i, mask=m)
        acc += tl.load(q + i, mask=m) + tl.load(r + i, mask=m) + tl.load(s + i, mask=m) + tl.load(t + i, mask=m)
        acc += tl.load(u + i, mask=m) + tl.load(v + i, mask=m) + tl.load(w + i, mask=m)
        tl.store(a + i, acc + x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7, mask=m)

    xs = [torch.zeros(4096, device="cuda") for _ in range(16)]
    scalars = [0.5] * 8
    compiled4 = add4[(4,)](*xs[:4], 4096, BLOCK=1024)
    compiled16 = add16[(4,)](*xs, 4096, *scalars, BLOCK=1024)
    return [("Triton JIT launch, 4 tensors, 1 int", per_call(lambda: add4[(4,)](*xs[:4], 4096, BLOCK=1024))),
            ("Triton JIT launch, 16 tensors, 1 int, 8 floats",
             per_call(lambda: add16[(4,)](*xs, 4096, *scalars, BLOCK=1024))),
            ("Triton compiled kernel called directly, 4 tensors",
             per_call(lambda: compiled4[(4, 1, 1)](*xs[:4], 4096, 1024))),
            ("Triton compiled kernel called directly, 16 tensors, 9 scalars",
             per_call(lambda: compiled16[(4, 1, 1)](*xs, 4096, *scalars, 1024)))]


def torch_rows(dev) -> list[tuple[str, float]]:
    x = torch.zeros(64, 4096, device=dev)
    params = [torch.zeros(1 << 20, device=dev), torch.zeros(12288, device=dev)]
    grads, m, v = ([torch.ones_like(p) for p in params] for _ in range(3))
    steps = [torch.zeros((), device=dev) for _ in params]

    def fused_adam():
        torch._fused_adam_(params, grads, m, v, [], steps, lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.0,
                           eps=1e-15, amsgrad=False, maximize=False)
    rows = [("torch.empty(1024)", per_call(lambda: torch.empty(1024, device=dev))),
            ("tensor.add_", per_call(lambda: x.add_(x))),
            ("tensor.sum()", per_call(lambda: x.sum()))]
    if dev.type == "cuda":
        rows.append(("torch._fused_adam_, two tensors", per_call(fused_adam)))
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tinn.init()
    dev = tinn.runtime.device()
    rows = taichi_rows(dev)
    if dev.type == "cuda":
        rows += triton_rows()
    rows += torch_rows(dev)
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    print(f"{'what':62s} us/call   ({where})")
    for name, us in rows:
        print(f"{name:62s} {us:8.1f}")
    payload = {"device": where, "rows": [{"what": name, "us": us} for name, us in rows]}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()

"""Host cost of one Taichi launch by argument count, next to a few torch ops (same process), to see
where the image step's host time goes on a given machine. Prints us per call."""
import time

import torch

import tinn  # noqa: E402
from tinn.backend import ti  # noqa: E402

tinn.init()
from tinn.kernels.launch import fast_kernel  # noqa: E402

A = ti.types.ndarray(dtype=ti.f32, ndim=1)


@ti.kernel
def k1(a: A):
    for i in range(1):
        a[i] += 1.0


@ti.kernel
def k4(a: A, b: A, c: A, d: A):
    for i in range(1):
        a[i] += b[i] + c[i] + d[i]


@ti.kernel
def k12(a: A, b: A, c: A, d: A, e: A, f: A, g: A, h: A, p: A, q: A, r: A, s: A):
    for i in range(1):
        a[i] += b[i] + c[i] + d[i] + e[i] + f[i] + g[i] + h[i] + p[i] + q[i] + r[i] + s[i]


def per_call(fn, n=2000):
    for _ in range(50):
        fn()
    tinn.runtime.sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    tinn.runtime.sync()
    return (t1 - t0) / n * 1e6


def main():
    dev = tinn.runtime.device()
    t = [torch.zeros(1024, device=dev) for _ in range(12)]
    rows = []
    for name, k, n in (("k1", k1, 1), ("k4", k4, 4), ("k12", k12, 12)):
        fk = fast_kernel(k)
        rows.append((f"taichi launch, {n} tensors", per_call(lambda: k(*t[:n]))))
        rows.append((f"fast launch, {n} tensors", per_call(lambda: fk(*t[:n]))))
        t_kernel, compiled = next(iter(fk.instances.values()))

        def setup_only():
            ctx = t_kernel.make_launch_context()
            for slot, a in enumerate(t[:n]):
                ctx.set_arg_external_array_with_shape((slot,), a.data_ptr(), a.element_size() * a.numel(),
                                                      list(a.shape), 0)
            return ctx
        rows.append((f"  its context + args only, {n} tensors", per_call(setup_only)))
    x = torch.zeros(64, 4096, device=dev)
    y = torch.zeros(4096, 64, device=dev)
    o = torch.zeros(64, 64, device=dev)
    rows.append(("torch.empty(1024)", per_call(lambda: torch.empty(1024, device=dev))))
    rows.append(("tensor.as_strided", per_call(lambda: x.as_strided((64, 64), (4096, 1), 0))))
    rows.append(("torch.mm(out=) 64x4096x64", per_call(lambda: torch.mm(x, y, out=o))))
    rows.append(("tensor.sum()", per_call(lambda: x.sum())))
    print(f"{'what':42s} us/call   ({torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'})")
    for name, us in rows:
        print(f"{name:42s} {us:8.1f}")


if __name__ == "__main__":
    main()

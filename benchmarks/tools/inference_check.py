"""Wall time of `NetworkArray.inference` per call, with the routing sort's keys narrowed or int32.

    python -m benchmarks.tools.inference_check        (CUDA)

2^22 samples, even routing, 32 in, 16 out, 2 hidden layers; cases 4096 x 64, 64 x 64, 4096 x 128. Each call
is timed with a device sync around it (median and best of 20), with the input checks on and off, once with
the keys `tinn.routing.sort_keys` picks and once with the int32 ids as they come; then torch.profiler's
CUDA kernels of five calls, so the forward kernel and the sort can be told from the host's share.
"""
import statistics
import sys
import time

import torch

import tinn  # noqa: E402


def wall_ms(fn, reps: int = 20) -> tuple[float, float]:
    times = []
    for _ in range(reps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e3, min(times[3:]) * 1e3


def main():
    if tinn.init() != "cuda":
        sys.exit("inference_check.py needs CUDA")
    from torch.profiler import ProfilerActivity, profile

    from tinn import routing
    from tinn.networks import NetworkArray

    dev = tinn.runtime.device()
    batch = 1 << 22
    narrow = routing.sort_keys
    for n, width in ((4096, 64), (64, 64), (4096, 128)):
        net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
        x = torch.rand(batch, 32, device=dev)
        ids = (torch.arange(batch, device=dev) % n).to(torch.int32)
        with torch.no_grad():
            for keys in ("narrow", "int32"):
                routing.sort_keys = narrow if keys == "narrow" else (lambda net_ids, n_networks: net_ids)
                for checks in (True, False):
                    with tinn.checks.disabled(not checks):
                        med, best = wall_ms(lambda: net.inference(x, ids))
                        print(f"N={n} w={width} keys={keys} checks={checks}: median {med:.3f} ms, best {best:.3f} ms")
            routing.sort_keys = narrow
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    net.inference(x, ids)
                torch.cuda.synchronize()
        events = sorted((e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA),
                        key=lambda e: -e.device_time_total)
        for e in events[:6]:
            print(f"   {e.key[:70]:70s} {e.count / 5:4.1f} {e.device_time_total / 1e3 / 5:8.3f} ms")


if __name__ == "__main__":
    main()

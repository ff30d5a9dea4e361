"""Timing and reporting helpers shared by the benchmarks."""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import json
import os
import statistics
import time

import torch

import tinn


def sync() -> None:
    tinn.runtime.sync()


def mlp_path(network) -> str:
    """Which code runs a NetworkArray (`NetworkArray.path`: "tensor_cores", "fused", "unfused", "dense",
    "batched_gemm")."""
    return network.path


@contextlib.contextmanager
def settings_installed(chosen):
    """tinn's settings and tuning `chosen` (a `tinn.settings.SettingsAndTuning`) in force inside the block (modules
    built there take them), the previous after:
    variants of one process measured side by side."""
    before = tinn.settings.installed()
    tinn.settings.install(chosen)
    try:
        yield
    finally:
        tinn.settings.install(before)


class Sections:
    """Host wall time spent inside chosen functions, by label, with their call counts: `wrap` replaces a
    method by a timed one, `wrap_launches` times every lean Taichi launch as "launch <kernel>". No syncs:
    each figure is what that code costs the calling threads (the GPU runs behind). Inclusive: an outer
    section contains its inner ones."""

    def __init__(self):
        self.spent = collections.defaultdict(float)
        self.calls = collections.Counter()

    def timed(self, label: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] += time.perf_counter() - t0
                self.calls[label] += 1
        return wrapper

    def wrap(self, owner, name: str, label: str | None = None) -> None:
        setattr(owner, name, self.timed(label or f"{owner.__name__}.{name}", getattr(owner, name)))

    def wrap_launches(self) -> None:
        from tinn.kernels import launch
        real_call = launch.FastKernel.__call__
        sections = self

        def kernel_call(kernel, *args):
            t0 = time.perf_counter()
            try:
                return real_call(kernel, *args)
            finally:
                sections.spent["launch " + kernel.__name__] += time.perf_counter() - t0
                sections.calls["launch " + kernel.__name__] += 1

        launch.FastKernel.__call__ = kernel_call

    def clear(self) -> None:
        self.spent.clear()
        self.calls.clear()

    def rows(self, steps: int) -> list[dict]:
        """{section, calls (per step), us (per step)}, the costliest first."""
        return [{"section": label, "calls": self.calls[label] / steps, "us": 1e6 * t / steps}
                for label, t in sorted(self.spent.items(), key=lambda kv: -kv[1])]


def settle(step) -> None:
    """Steps of a Trainer until its steady state: the capture of its step graph and the graph's trial against steps
    op by op are behind it (tinn/step_graphs.py), so that timed steps all take the way it keeps."""
    from tinn import step_graphs
    for _ in range(step_graphs.CAPTURE_AT + 2 * (1 + step_graphs.TRIAL_STEPS) + 1):
        step()
    sync()


def time_fn(fn, warmup: int = 2, reps: int = 5) -> float:
    """Median wall time in seconds of fn() with device syncs around each call."""
    return statistics.median(time_pipelined_blocks(fn, warmup, steps=1, blocks=reps))


def time_pipelined_blocks(fn, warmup: int = 2, steps: int = 10, blocks: int = 3) -> list[float]:
    """Mean wall time in seconds of fn() per block of `steps` calls issued back to back with one device sync
    at the block's end, for each of `blocks` blocks in order. With many steps a block runs as a training loop
    does: the host's work for a call overlaps the device's work for the one before, where one step per block
    (`time_fn`) counts the host's lead-in of every call. The blocks' spread shows how much one block's number
    can be trusted (clocks and the machine drift within a process too)."""
    for _ in range(warmup):
        fn()
    sync()
    means = []
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        sync()
        means.append((time.perf_counter() - t0) / steps)
    return means


def gpu_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """Median milliseconds between CUDA events recorded around each of `reps` calls of fn(), after `warmup`
    unmeasured ones: the GPU time of the work fn issues, plus any gap while the host issues it. CUDA only."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def pipelined_ms(fn, steps: int, blocks: int = 3) -> float:
    """Milliseconds per call, calls issued back to back with one sync per block: the median block's mean."""
    return 1e3 * statistics.median(time_pipelined_blocks(fn, warmup=0, steps=steps, blocks=blocks))


def record_pipelined(row: dict, prefix: str, fn, steps: int, blocks: int = 3) -> None:
    """row[prefix_train_pipelined_ms] = the median block's mean ms per step; row[..._spread_ms] = the blocks'
    [min, max], and row[..._spread_pct] = (max - min) / median in percent."""
    means = [1e3 * t for t in time_pipelined_blocks(fn, steps=steps, blocks=blocks)]
    median = statistics.median(means)
    row[f"{prefix}_train_pipelined_ms"] = median
    row[f"{prefix}_train_pipelined_spread_ms"] = [min(means), max(means)]
    row[f"{prefix}_train_pipelined_spread_pct"] = 100 * (max(means) - min(means)) / median


def peak_memory_reset() -> None:
    """Start a peak-memory window: unreachable objects of earlier cases (reference cycles that Python's
    collector has not reached yet) are freed first, so they do not count towards this case's peak, and the
    allocator's cache is emptied: a block served from a cached segment a little larger than the request
    counts whole, so segments left by earlier cases would change the peak with the order of the cases."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mib() -> float:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else float("nan")


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """columns: (key, header, format)."""
    headers = [h for _, h, _ in columns]
    cells = [[("-" if r.get(k) is None else format(r[k], f)) for k, _, f in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(" | ".join(h.rjust(w) for h, w in zip(headers, widths)))
    print("-+-".join("-" * w for w in widths))
    for c in cells:
        print(" | ".join(v.rjust(w) for v, w in zip(c, widths)))


def cuda_kernels(fn, n: int = 10) -> list[dict]:
    """{kernel, calls, ms} per call of fn, Taichi's kernels and torch's alike (torch.profiler's CUDA trace),
    the costliest first."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        sync()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [{"kernel": e.key[:60], "calls": e.count / n, "ms": e.device_time_total / 1e3 / n}
            for e in sorted(events, key=lambda e: -e.device_time_total)]


def write_json(path: str | None, payload: dict) -> None:
    """`payload` as indented JSON at `path` (its folder made if missing); nothing for None."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


def host_ms_per_step(step, bursts: int = 5, steps: int = 8) -> float:
    """Host time alone of one step: a few steps enqueued right after a sync return before the GPU
    catches up (the launch queue holds far more than `steps`), so their wall time is the Python and
    launch side. Best of `bursts`."""
    times = []
    for _ in range(bursts):
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) * 1e3 / steps)
    sync()
    return min(times)


@contextlib.contextmanager
def tf32_matmuls(allowed: bool):
    """`torch.backends.cuda.matmul.allow_tf32 = allowed` inside the block; the previous value after, also when
    the block raises (the flag is process-wide: a later baseline must not inherit it)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def waiting_calls(step, busy_ms: float = 100.0) -> list[tuple[str, float]]:
    """[(function, own ms)] of the calls in one `step` that waited for the device: the GPU is first kept busy
    for about `busy_ms` (torch.cuda._sleep), so a call that blocks until earlier work finishes takes most of
    that time, whoever issued the wait (Taichi, the driver, torch). torch's sync debug mode sees only torch's
    own waits; this sees every one. CUDA only; [] when nothing waited."""
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(1_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles = int(1_000_000 * busy_ms / max(start.elapsed_time(end), 1e-3))
    torch.cuda._sleep(cycles)
    rows = _profiled(step)
    torch.cuda.synchronize()
    found = [(where, 1e3 * own) for where, _, own, _ in rows if 1e3 * own > busy_ms / 2]
    return sorted(found, key=lambda r: -r[1])


def _profiled(run) -> list[tuple[str, int, float, float]]:
    """[(function as folder/file:line(name), calls, own seconds, cumulative seconds)] of everything `run()`
    called, by cProfile."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    return [(f"{'/'.join(file.split('/')[-2:])}:{line}({name})", calls, own, cumulative)
            for (file, line, name), (_, calls, own, cumulative, _) in pstats.Stats(profiler).stats.items()]


def host_table(step, steps: int, top: int) -> list[tuple[str, float, float, float]]:
    """[(function, calls per step, own ms per step, cumulative ms per step)] of the `top` functions by own time
    over `steps` steps (cProfile; its own overhead inflates every row by a similar share)."""
    sync()
    profiled = _profiled(lambda: [step() for _ in range(steps)])
    sync()
    rows = [(where, calls / steps, 1e3 * own / steps, 1e3 * cumulative / steps)
            for where, calls, own, cumulative in profiled]
    rows.sort(key=lambda r: -r[2])
    return rows[:top]


def taichi_launch_times(step, steps: int) -> list[tuple[str, float, float]]:
    """[(kernel, calls per step, host ms per step)] of the Taichi kernels launched through
    `tinn.kernels.launch.fast_kernel` during `steps` steps, slowest first: which launch a host-bound step waits
    on (cProfile charges the C++ launch to the wrapper, whatever the kernel)."""
    from tinn.kernels.launch import FastKernel

    totals: dict[str, list[float]] = {}
    original = FastKernel.__call__

    def timed(self, *args):
        t0 = time.perf_counter()
        try:
            return original(self, *args)
        finally:
            entry = totals.setdefault(self.__name__, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - t0

    sync()
    FastKernel.__call__ = timed
    try:
        for _ in range(steps):
            step()
    finally:
        FastKernel.__call__ = original
    sync()
    rows = [(name, calls / steps, 1e3 * seconds / steps) for name, (calls, seconds) in totals.items()]
    return sorted(rows, key=lambda r: -r[2])


def host_profile(step, steps: int, top: int, indent: str = "", max_launches: int | None = None) -> dict:
    """Where a host-bound step's host time goes, printed and returned: the calls that waited for a busy device
    (`waiting_calls`), the host time per Taichi launch (`taichi_launch_times`, the slowest `max_launches`
    printed) and the `top` Python functions by own time (`host_table`), over `steps` steps. CUDA only."""
    out = {"waiting_calls": waiting_calls(step)}
    print(f"{indent}calls that waited for a busy device: {out['waiting_calls'] or 'none'}")
    out["taichi_launches"] = taichi_launch_times(step, steps)
    print(f"{indent}Taichi launches: " + ", ".join(f"{name} x{calls:g} {ms:.3f} ms"
                                                    for name, calls, ms in out["taichi_launches"][:max_launches]))
    out["host"] = host_table(step, steps, top)
    print(f"{indent}host, by function: calls/step, own ms/step, cumulative ms/step")
    for name, calls, own, cumulative in out["host"]:
        print(f"{indent or '  '}{name[:72]:72s} {calls:5.1f} {own:8.3f} {cumulative:8.3f}")
    return out

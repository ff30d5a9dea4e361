"""Wall time of `NetworkArray.inference` per call, and what its inference tiles cost the forward kernel.

    python -m benchmarks.tools.inference_check [--tile-sweep] [--json out/inference_check.json]     (CUDA)

2^22 samples, 32 in, 16 out, 2 hidden layers; cases 4096 x 64, 64 x 64, 4096 x 128, each with interleaved ids
(sample i to network i mod N) and ragged ones (networks drawn with very uneven weights). Each call is timed with
a device sync around it (median and best of 20), with the input checks on and off; then torch.profiler's CUDA
kernels of five calls, so the forward kernel and the sort can be told from the host's share.

--tile-sweep: the forward kernel alone (CUDA events, medians) over the routing's sort, for inference tiles of
128 to 2048 samples and the kernel's block, warps and pipeline stages; the fastest few per case, beside the
tile `tinn.networks.tensor_cores.inference_tile` picks with the tuned options.

--parts: instead, the call's parts one by one (CUDA events, medians), for the 4096 x 64 and 64 x 64 cases with
interleaved ids and ids already sorted: the whole call with the checks on and off, the sort, the sort with its
bounds, the tile list, the weight packing, the forward kernel on float32 and on float16 inputs, the NaN/Inf scan
of x, and a copy of x (what moving 512 MB each way costs on the machine); for sorted ids also the whole call with
them declared grouped (`routing.grouped`: no sort, rows read in order) and the kernel reading rows in order, on
float32 and with float16 inputs and outputs (the I/O of tcnn's own inference benchmark).
"""
import argparse
import dataclasses
import statistics
import sys
import time

import torch

import tinn

from benchmarks.common import cuda_kernels, gpu_ms, write_json

CASES = ((4096, 64), (64, 64), (4096, 128))
BATCH = 1 << 22
TILES = (128, 256, 512, 1024, 2048)
OPTIONS = ((128, 4, 1), (128, 4, 2), (128, 4, 3), (128, 8, 2), (64, 4, 2), (256, 8, 2))  # block, warps, stages


def wall_ms(fn, reps: int = 20) -> tuple[float, float]:
    times = []
    for _ in range(reps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:]) * 1e3, min(times[3:]) * 1e3


def make_ids(kind: str, n: int, dev) -> torch.Tensor:
    if kind == "interleaved":
        return (torch.arange(BATCH, device=dev) % n).to(torch.int32)
    if kind == "sorted":
        return (torch.arange(BATCH, device=dev) * n // BATCH).to(torch.int32)
    gen = torch.Generator(device=dev).manual_seed(0)
    weights = torch.rand(n, device=dev, generator=gen) ** 3 + 0.01
    return torch.multinomial(weights, BATCH, replacement=True, generator=gen).to(torch.int32)


def tile_sweep(net, x, ids) -> list[dict]:
    """The forward kernel's GPU time per (tile, block, warps, stages), every output checked equal to the first."""
    from tinn import routing
    from tinn.kernels.tensor_cores import launch, tiles
    tc = net.tensor_cores
    order, bounds = routing.sorted_bounds(ids, net.n_networks)
    packed = launch.pack_weights(net.params.detach(), tc.shape, tc.precision)
    chosen = launch.launch_options
    rows, first = [], None
    for block, warps, stages in OPTIONS:
        for tile in TILES:
            if tile < block:
                continue
            (tile_list,) = tiles.tile_lists(order, bounds, BATCH, (tile,), False)
            launch.launch_options = lambda *a, **k: launch.LaunchOptions(block, warps, stages)
            try:
                def call():
                    return launch.forward(x, False, tile_list, packed, tc.shape, input_padding=tc.input_padding)[0]
                out = call()
                first = out if first is None else first
                rows.append(dict(tile=tile, block=block, warps=warps, stages=stages, ms=gpu_ms(call),
                                 same=bool(torch.equal(out, first))))
            finally:
                launch.launch_options = chosen
    return rows


def parts(dev) -> list[dict]:
    """`--parts`: GPU ms of each part of an inference call (module docstring)."""
    from tinn import routing
    from tinn.kernels.tensor_cores import launch, mlp, tiles
    from tinn.networks import NetworkArray
    from tinn.networks.tensor_cores import inference_tile

    rows = []
    for n, width in CASES[:2]:
        net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
        tc, params = net.tensor_cores, net.params.detach()
        x = torch.rand(BATCH, 32, device=dev)
        x16 = x.half()
        tile = inference_tile(BATCH, launch.default_block_m(dev))
        for kind in ("interleaved", "sorted"):
            ids = make_ids(kind, n, dev)
            order, bounds = routing.sorted_bounds(ids, n)
            (tile_list,) = tiles.tile_lists(order, bounds, BATCH, (tile,), False)
            packed = launch.pack_weights(params, tc.shape, tc.precision)
            in_order = dataclasses.replace(tile_list, in_order=True)
            out16 = torch.empty(BATCH, 16, device=dev, dtype=torch.float16)

            def grouped_call():
                with routing.grouped(ids, bounds):
                    return net.inference(x, ids)

            def kernel_16bit_io():  # float16 in and out, rows in order: tcnn's benchmark's I/O
                # (the constants made per call, as launch.forward makes them in the other kernel rows)
                consts = launch.kernel_constants(tc.shape, packed.geometry, tc.precision, x16.shape[1],
                                                 launch.launch_options(packed.geometry, tc.precision, dev, None,
                                                                       "inference"))
                mlp.forward_kernel[(in_order.tile_net.shape[0],)](
                    x16, x16.stride(0), x16.stride(1), 0.0, packed.weights, packed.weights.stride(0), in_order.order,
                    in_order.tile_net, in_order.tile_start, in_order.tile_count, out16, out16.stride(0), out16, 0,
                    SAVE=False, WIDE_OFFSETS=False, IN_ORDER=True, **consts)

            timed = {
                "whole inference (checks on)": lambda: net.inference(x, ids),
                "whole inference (checks off)": lambda: net.inference(x, ids),
                "sort keys+sort": lambda: torch.sort(routing.sort_keys(ids, n), stable=True),
                "sorted_bounds": lambda: routing.sorted_bounds(ids, n),
                "tile_lists": lambda: tiles.tile_lists(order, bounds, BATCH, (tile,), False),
                "pack_weights": lambda: launch.pack_weights(params, tc.shape, tc.precision),
                "forward kernel, fp32 x": lambda: launch.forward(x, False, tile_list, packed, tc.shape,
                                                                 input_padding=tc.input_padding),
                "forward kernel, fp16 x": lambda: launch.forward(x16, False, tile_list, packed, tc.shape,
                                                                 input_padding=tc.input_padding),
                "all_finite(x)": lambda: tinn.checks.all_finite(x),
                **({"whole inference, grouped (checks off)": grouped_call,
                    "forward kernel in order, fp32 x": lambda: launch.forward(x, False, in_order, packed, tc.shape,
                                                                              input_padding=tc.input_padding),
                    "forward kernel in order, fp16 x and out": kernel_16bit_io} if kind == "sorted" else {}),
                "copy x (bandwidth ref)": lambda: x.clone(),
            }
            for name, fn in timed.items():
                with torch.no_grad(), tinn.checks.disabled(name != "whole inference (checks on)"):
                    ms = gpu_ms(fn, reps=30)
                rows.append(dict(networks=n, width=width, ids=kind, part=name, ms=ms))
                print(f"N={n} w={width} ids={kind:11s} {name:32s} {ms:7.3f} ms")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tile-sweep", action="store_true")
    p.add_argument("--parts", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("inference_check.py needs CUDA")
    if args.parts:
        write_json(args.json, {"batch": BATCH, "parts": parts(tinn.runtime.device())})
        return
    from tinn.kernels.tensor_cores import launch
    from tinn.networks import NetworkArray
    from tinn.networks.tensor_cores import inference_tile

    dev = tinn.runtime.device()
    results = []
    for n, width in CASES:
        net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
        x = torch.rand(BATCH, 32, device=dev)
        for kind in ("interleaved", "ragged"):
            ids = make_ids(kind, n, dev)
            entry = dict(networks=n, width=width, ids=kind, path=net.path,
                         tile=inference_tile(BATCH, launch.default_block_m(dev)))
            with torch.no_grad():
                for checks in (True, False):
                    with tinn.checks.disabled(not checks):
                        med, best = wall_ms(lambda: net.inference(x, ids))
                    entry[f"{'checked' if checks else 'unchecked'}_ms"] = med
                    print(f"N={n} w={width} ids={kind} tile={entry['tile']} checks={checks}: median {med:.3f} ms, "
                          f"best {best:.3f} ms")
                entry["kernels"] = cuda_kernels(lambda: net.inference(x, ids), n=5)[:6]
                for k in entry["kernels"]:
                    print(f"   {k['kernel']:60s} {k['calls']:4.1f} {k['ms']:8.3f} ms")
                if args.tile_sweep:
                    rows = tile_sweep(net, x, ids)
                    entry["sweep"] = rows
                    options = launch.launch_options(net.tensor_cores.kernels.Geometry.of(net.shape), net.precision, dev,
                                                    kernel="inference")
                    for r in sorted(rows, key=lambda r: r["ms"])[:5]:
                        print(f"   sweep tile={r['tile']:4d} block={r['block']:3d} warps={r['warps']} "
                              f"stages={r['stages']}: {r['ms']:.3f} ms same={r['same']}")
                    for r in rows:
                        if (r["block"], r["warps"], r["stages"]) == tuple(options) and r["tile"] in (128, entry["tile"]):
                            print(f"   tuned options, tile={r['tile']:4d}: {r['ms']:.3f} ms")
            results.append(entry)
    write_json(args.json, {"batch": BATCH, "cases": results})


if __name__ == "__main__":
    main()

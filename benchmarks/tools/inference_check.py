"""Wall time of `NetworkArray.inference` per call, and what its inference tiles cost the forward kernel.

    python -m benchmarks.tools.inference_check [--tile-sweep] [--json out/inference_check.json]     (CUDA)

2^22 samples, 32 in, 16 out, 2 hidden layers; cases 4096 x 64, 64 x 64, 4096 x 128, each with interleaved ids
(sample i to network i mod N) and ragged ones (networks drawn with very uneven weights). Each call is timed with
a device sync around it (median and best of 20), with the input checks on and off; then torch.profiler's CUDA
kernels of five calls, so the forward kernel and the sort can be told from the host's share.

--tile-sweep: the forward kernel alone (CUDA events, medians) over the routing's sort, for inference tiles of
128 to 2048 samples and the kernel's block, warps and pipeline stages; the fastest few per case, beside the
tile `tinn.networks.tensor_cores.inference_tile` picks with the tuned options.
"""
import argparse
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tile-sweep", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if tinn.init() != "cuda":
        sys.exit("inference_check.py needs CUDA")
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

"""Hash-grid encoding throughput: tinn (Taichi kernels) against a plain-PyTorch hash grid, same run.

For 1 grid and for an array of grids (one per network, samples routed by id) it times
  fwd        inference lookup (no autograd)
  fwd+bwd    lookup plus backward to the tables and to the inputs (a training step's encoding part;
             with --no-input-grad to the tables only, the usual case when positions need no gradient)
and prints samples/s (plus the implied backward-only rate), checking first that both
implementations give the same features. tinn is timed with its sync-costing input checks
(net_ids range scan) switched off, as `NetworkWithInputEncoding` does after validating once.

    python -m benchmarks.bench_grid --device cuda --json grid.json
    python -m benchmarks.bench_grid --device cpu            # small sizes, runs in seconds
"""
from __future__ import annotations

import argparse
import platform

import torch


import tinn  # noqa: E402
from benchmarks.common import peak_memory_mib, peak_memory_reset, print_table, time_fn, write_json  # noqa: E402
from tinn.encodings import GridEncoding  # noqa: E402
from tinn.encodings.grid_layout import HASH_PRIMES  # noqa: E402

M32 = 0xFFFFFFFF


class TorchHashGrid(torch.nn.Module):
    """Vectorised PyTorch hash grid with tinn's/tcnn's layout (levels, offsets, hash); autograd backward."""

    def __init__(self, ref: GridEncoding):
        super().__init__()
        self.levels = [(lv.scale, lv.resolution, lv.offset, lv.size, ref.layout.level_is_hashed(i))
                       for i, lv in enumerate(ref.layout.levels)]
        self.n_dims, self.n_features = ref.n_input_dims, ref.n_features_per_level
        self.params = torch.nn.Parameter(ref.params.detach().clone())
        d = self.n_dims
        dev = self.params.device
        self.register_buffer("corners", torch.tensor([[(c >> k) & 1 for k in range(d)] for c in range(1 << d)],
                                                     device=dev))
        self.register_buffer("primes", torch.tensor(HASH_PRIMES[ref.hash][:d], dtype=torch.int64, device=dev))

    def forward(self, x, ids):
        n_params = self.params.shape[1]
        f = self.n_features
        table = self.params.view(-1)
        feat = torch.arange(f, device=x.device)
        outs = []
        for scale, res, offset, size, hashed in self.levels:
            pos = x * scale + 0.5
            cell = torch.floor(pos)
            t = pos - cell
            coords = cell.long()[:, None, :] + self.corners[None]                       # (B, 2^D, D)
            if hashed:
                h = (coords * self.primes) & M32
                idx = h[..., 0]
                for k in range(1, self.n_dims):
                    idx = idx ^ h[..., k]
            else:
                strides = torch.tensor([res**k for k in range(self.n_dims)], device=x.device)
                idx = (coords * strides).sum(-1) & M32
            idx = idx % size
            f_dim = torch.where(self.corners[None].bool(), t[:, None, :], 1 - t[:, None, :])          # (B, 2^D, D)
            w = f_dim[..., 0]
            for k in range(1, self.n_dims):  # not .prod(-1): its CUDA backward (a cumprod scan) is ~100x slower
                w = w * f_dim[..., k]                                                              # (B, 2^D)
            flat = ids.long()[:, None] * n_params + (offset + idx) * f                            # (B, 2^D)
            # index_select, not table[...]: its backward is an atomic index_add_ instead of a sort
            vals = table.index_select(0, (flat[..., None] + feat).view(-1)).view(*flat.shape, f)  # (B, 2^D, F)
            outs.append((w[..., None] * vals).sum(1))
        return torch.cat(outs, dim=1)


def bench_case(name, grid: GridEncoding, batch: int, iters: int, seed: int = 0, input_grad: bool = True):
    dev = tinn.runtime.device()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.rand(batch, grid.n_input_dims, generator=gen).to(dev)
    ids = torch.randint(0, grid.n_networks, (batch,), generator=gen, dtype=torch.int32).to(dev)
    with torch.no_grad():
        grid.params.uniform_(-1, 1)
    ref = TorchHashGrid(grid)

    with torch.no_grad():
        err = (grid(x, ids) - ref(x, ids)).abs().max().item()
    # float32 summation order differs; anything above 1e-3 would be a layout/hash disagreement
    assert err < 1e-3, f"{name}: tinn and torch hash grids disagree (max abs diff {err})"

    def fwd(enc):
        def run():
            with torch.no_grad():
                enc(x, ids)
        return run

    def train(enc):
        xg = x.clone().requires_grad_(input_grad)

        def run():
            enc.params.grad = None
            xg.grad = None
            enc(xg, ids).sum().backward()
        return run

    rows = []
    for impl, enc in (("tinn", grid), ("torch", ref)):
        try:
            peak_memory_reset()
            with tinn.checks.disabled():
                t_fwd = time_fn(fwd(enc), warmup=2, reps=iters)  # warm-up also compiles the Taichi kernels
                t_train = time_fn(train(enc), warmup=2, reps=iters)
            rows.append({"case": name, "impl": impl, "fwd_samples_per_s": batch / t_fwd,
                         "fwd_bwd_samples_per_s": batch / t_train,
                         "bwd_samples_per_s": batch / max(t_train - t_fwd, 1e-12),
                         "fwd_ms": t_fwd * 1e3, "fwd_bwd_ms": t_train * 1e3, "peak_mib": peak_memory_mib()})
        except torch.OutOfMemoryError as e:  # the torch version materialises (B, 2^D, F) per level
            rows.append({"case": name, "impl": impl, "error": f"out of memory: {str(e)[:80]}"})
            torch.cuda.empty_cache()
    base = {"batch": batch, "n_networks": grid.n_networks, "n_levels": grid.n_levels,
            "n_features_per_level": grid.n_features_per_level, "log2_hashmap_size": grid.log2_hashmap_size,
            "params_per_grid": grid.n_params_per_network(), "table_bytes_total": grid.memory_bytes(),
            "max_abs_diff": err}
    return [dict(base, **r) for r in rows]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch", type=int, default=None, help="samples per call (default 2^18 GPU, 2^12 CPU)")
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--grids", default="1,1024", help="comma-separated grid counts")
    p.add_argument("--n-dims", type=int, default=3)
    p.add_argument("--n-levels", type=int, default=None)
    p.add_argument("--features", type=int, default=2)
    p.add_argument("--log2-single", type=int, default=None, help="log2_hashmap_size for 1 grid")
    p.add_argument("--log2-array", type=int, default=None, help="log2_hashmap_size per grid in arrays")
    p.add_argument("--no-input-grad", action="store_true", help="fwd+bwd to the tables only (no dL/dx)")
    p.add_argument("--json", default=None, help="write results here")
    a = p.parse_args(argv)

    arch = tinn.init(a.device)
    gpu = arch == "cuda"
    batch = a.batch or (1 << 18 if gpu else 1 << 12)
    iters = a.iters or (20 if gpu else 3)
    n_levels = a.n_levels or (16 if gpu else 8)
    log2_single = a.log2_single or (19 if gpu else 14)
    log2_array = a.log2_array or (14 if gpu else 8)

    results = []
    for n in [int(s) for s in a.grids.split(",")]:
        grid = GridEncoding(a.n_dims, n_levels=n_levels, n_features_per_level=a.features,
                            log2_hashmap_size=log2_single if n == 1 else log2_array, base_resolution=16,
                            per_level_scale=1.5, n_networks=n)
        results += bench_case(f"{n} grid{'s' if n > 1 else ''}", grid, batch, iters, input_grad=not a.no_input_grad)
        del grid
        if gpu:
            torch.cuda.empty_cache()

    device = torch.cuda.get_device_name(0) if gpu else platform.processor() or "cpu"
    print(f"\nhash grid encoding, {a.n_dims}D, {n_levels} levels x {a.features} features, batch {batch}, "
          f"arch={arch} ({device}); median of {iters} runs; backward to "
          f"{'the tables only' if a.no_input_grad else 'tables and inputs'}")
    for r in results:
        for k in ("fwd_samples_per_s", "fwd_bwd_samples_per_s", "bwd_samples_per_s"):
            if k in r:
                r[k.replace("samples_per_s", "msps")] = r[k] / 1e6
    print_table(results, [("case", "case", ""), ("impl", "impl", ""), ("fwd_msps", "fwd Msamples/s", ".2f"),
                          ("fwd_bwd_msps", "fwd+bwd Msamples/s", ".2f"), ("bwd_msps", "bwd Msamples/s", ".2f"),
                          ("fwd_ms", "fwd ms", ".2f"), ("fwd_bwd_ms", "fwd+bwd ms", ".2f"),
                          ("peak_mib", "peak MiB", ".0f"), ("error", "error", "")])
    for case in dict.fromkeys(r["case"] for r in results):
        t = {r["impl"]: r for r in results if r["case"] == case and "error" not in r}
        if "tinn" in t and "torch" in t:
            fwd = t["tinn"]["fwd_samples_per_s"] / t["torch"]["fwd_samples_per_s"]
            train = t["tinn"]["fwd_bwd_samples_per_s"] / t["torch"]["fwd_bwd_samples_per_s"]
            print(f"speed-up vs torch ({case}): fwd x{fwd:.1f}, fwd+bwd x{train:.1f}")
    write_json(a.json, {"benchmark": "grid", "arch": arch, "device": device, "torch": torch.__version__,
                        "input_grad": not a.no_input_grad, "batch": batch, "iters": iters, "results": results})
    if a.json:
        print(f"wrote {a.json}")
    return results


if __name__ == "__main__":
    main()

"""Every MLP-array kernel path against float64 over a sweep of shapes, each shape in a process of its own.

An out-of-bounds access in one shape must not corrupt another's result, so each runs alone (optionally under
`compute-sanitizer --tool memcheck`, which names the kernel that reads or writes out of bounds). Prints a table
(shape, path, relative errors of y / dx / dparams, sanitizer errors) and writes JSON.

    python -m benchmarks.tools.mlp_shape_sweep --kernels fused unfused --sanitize -j 12 --out out/sweep.json
"""
import argparse
import concurrent.futures as cf
import itertools
import json
import os
import random
import subprocess
import sys

from benchmarks.loading import ROOT

ACTS = ["ReLU", "Tanh", "Sigmoid", "Softplus", "None"]


def shapes(count: int = 72):
    """(n_in, width, n_out, hidden, n_networks, activation, output activation): a fixed pseudo-random subset
    of the grid below, odd and even widths, 1-wide inputs and outputs, no hidden layer, several networks."""
    grid = list(itertools.product([1, 2, 7, 9, 16, 17, 24, 32, 48, 64, 100, 128], [1, 4, 7, 32, 33],
                                  [1, 3, 16, 17], [0, 1, 2, 4], [1, 3, 37]))
    rng = random.Random(0)
    return [(n_in, width, n_out, hidden, nets, rng.choice(ACTS), rng.choice(ACTS))
            for width, n_in, n_out, hidden, nets in rng.sample(grid, count)]


def check(spec, kernels):
    import torch
    import tinn
    tinn.init()
    from benchmarks.loading import load_file
    reference = load_file("tests/reference.py")
    mlp_array, rel_err = reference.mlp_array, reference.rel_err
    from tinn.networks import NetworkArray
    n_in, width, n_out, hidden, n_nets, act, out_act = spec
    otype = "FullyFusedMLP" if width in (16, 32, 64, 128) else "CutlassMLP"
    net = NetworkArray(n_in, n_out, {"otype": otype, "n_neurons": width, "n_hidden_layers": hidden,
                                     "activation": act, "output_activation": out_act},
                       n_networks=n_nets, seed=3, kernels=kernels)
    dev = tinn.runtime.device()
    torch.manual_seed(0)
    batch = 777
    x = torch.rand(batch, n_in, device=dev) * 2 - 1
    w = torch.linspace(3, 0.5, n_nets) ** 2
    ids = torch.multinomial(w, batch, replacement=True).to(torch.int32).to(dev)
    dy = torch.randn(batch, n_out, device=dev)
    xr = x.clone().requires_grad_()
    y = net(xr, ids)
    y.backward(dy)
    yi = net.inference(x, ids)
    torch.cuda.synchronize() if dev.type == "cuda" else None
    p64 = net.params.detach().cpu().double().requires_grad_()
    x64 = x.cpu().double().requires_grad_()
    y64 = mlp_array(net, p64, x64, ids.cpu(), act, out_act)
    y64.backward(dy.cpu().double())
    return {"y": rel_err(y.detach().cpu(), y64), "inference": rel_err(yi.cpu(), y64),
            "dx": rel_err(xr.grad.cpu(), x64.grad), "dparams": rel_err(net.params.grad.cpu(), p64.grad),
            "fused": bool(net.fused)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kernels", nargs="+", default=["auto"])
    p.add_argument("--sanitize", action="store_true")
    p.add_argument("-j", type=int, default=8)
    p.add_argument("--out", default="out/mlp_shape_sweep.json")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        spec, kernels = json.loads(a.one)
        print("RESULT " + json.dumps(check(tuple(spec), kernels)))
        return
    jobs = [(s, k) for s in shapes() for k in a.kernels]

    def run(job):
        cmd = [sys.executable, "-m", "benchmarks.tools.mlp_shape_sweep", "--one", json.dumps(job)]
        if a.sanitize:
            cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "5"] + cmd
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        text = proc.stdout + proc.stderr
        res = next((json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")), None)
        san = [line for line in text.splitlines() if "Invalid" in line or "ERROR SUMMARY" in line]
        err = [line for line in text.splitlines() if "Error" in line][-1:] if res is None else []
        return {"shape": job[0], "kernels": job[1], "result": res, "sanitizer": san[:3], "error": err}

    rows = []
    with cf.ThreadPoolExecutor(a.j) as pool:
        for row in pool.map(run, jobs):
            rows.append(row)
            r = row["result"]
            bad = r is None or max(r["y"], r["inference"], r["dx"], r["dparams"]) > 1e-4 or any(
                "ERROR SUMMARY: 0" not in s for s in row["sanitizer"] if "SUMMARY" in s)
            vals = "crashed " + " ".join(row["error"])[:120] if r is None else \
                f"y {r['y']:.1e} inf {r['inference']:.1e} dx {r['dx']:.1e} dp {r['dparams']:.1e} fused={r['fused']}"
            print(f"{'BAD ' if bad else 'ok  '}{row['kernels']:8s} {str(row['shape']):55s} {vals} "
                  f"{' | '.join(s.strip()[:100] for s in row['sanitizer'] if 'SUMMARY' not in s)[:300]}", flush=True)
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

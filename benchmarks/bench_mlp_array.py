"""MLP-array benchmark: tinn against the PyTorch way of doing the same job, in one run.

PyTorch baseline: samples grouped by network into a zero-padded (N, max_count, dims)
batch, then `torch.bmm` per layer in fp32; training = the same forward, L2 loss,
autograd backward and `torch.optim.Adam`. tinn: `NetworkArray` forward, and
`Trainer.training_step` (forward, L2 loss kernel, hand-written backward, Adam kernel).

    python benchmarks/bench_mlp_array.py                       # GPU sizes if CUDA, tiny sizes on CPU
    python benchmarks/bench_mlp_array.py --networks 1,64,4096 --log2-samples 20,22 --json out.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tinn  # noqa: E402
from common import peak_memory_mib, peak_memory_reset, print_table, time_fn, write_json  # noqa: E402


def make_ids(batch: int, n: int, routing: str, device) -> torch.Tensor:
    if routing == "even":  # equal counts, shuffled order
        ids = torch.arange(batch, device=device) % n
        return ids[torch.randperm(batch, device=device)].to(torch.int32)
    if routing == "sorted":
        return (torch.arange(batch, device=device) * n // batch).to(torch.int32)
    w = torch.rand(n, device=device) ** 3 + 1e-3  # ragged
    return torch.multinomial(w, batch, replacement=True).to(torch.int32)


class TorchBmmArray(torch.nn.Module):
    """Reference PyTorch implementation: padded per-network batches and bmm."""

    def __init__(self, net):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(net.weights(l).detach().transpose(1, 2).contiguous()) for l in range(net.n_layers)])

    def forward(self, x, ids, n):
        order = torch.argsort(ids)
        counts = torch.bincount(ids, minlength=n)
        m = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        sorted_ids = ids[order].long()
        slot = torch.arange(x.shape[0], device=x.device) - starts[sorted_ids]
        h = torch.zeros(n, m, x.shape[1], device=x.device)
        h[sorted_ids, slot] = x[order]
        for l, w in enumerate(self.weights):
            h = torch.bmm(h, w)
            if l < len(self.weights) - 1:
                h = torch.relu(h)
        out = torch.empty(x.shape[0], h.shape[2], device=x.device)
        out[order] = h[sorted_ids, slot]
        return out


def bench_case(n: int, log2_samples: int, width: int, n_in: int, n_out: int, hidden: int, routing: str,
               reps: int, skip_torch: bool) -> dict:
    from tinn.networks import NetworkArray
    from tinn.trainer import Trainer

    dev = tinn.runtime.device()
    batch = 1 << log2_samples
    cfg = {"otype": "FullyFusedMLP", "n_neurons": width, "n_hidden_layers": hidden, "activation": "ReLU",
           "output_activation": "None"}
    net = NetworkArray(n_in, n_out, cfg, n_networks=n)
    x = torch.rand(batch, n_in, device=dev)
    target = torch.rand(batch, n_out, device=dev)
    ids = make_ids(batch, n, routing, dev)
    flop = net.flops_per_sample() * batch
    row = {"networks": n, "width": width, "samples": batch, "routing": routing}

    peak_memory_reset()
    with tinn.checks.disabled():
        row["tinn_fwd_ms"] = 1e3 * time_fn(lambda: net.inference(x, ids), reps=reps)
        trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam", "learning_rate": 1e-3})
        row["tinn_train_ms"] = 1e3 * time_fn(lambda: trainer.training_step(x, target, ids), reps=reps)
    row["tinn_mem_mib"] = peak_memory_mib()
    row["tinn_fwd_tflops"] = flop / row["tinn_fwd_ms"] / 1e9
    row["tinn_train_tflops"] = 3 * flop / row["tinn_train_ms"] / 1e9
    row["tinn_train_samples_per_s"] = batch / row["tinn_train_ms"] * 1e3

    if not skip_torch:
        ref = TorchBmmArray(net).to(dev)
        opt = torch.optim.Adam(ref.parameters(), lr=1e-3)

        def torch_step():
            opt.zero_grad(set_to_none=True)
            loss = torch.mean((ref(x, ids.long(), n) - target) ** 2)
            loss.backward()
            opt.step()

        peak_memory_reset()
        with torch.no_grad():
            row["torch_fwd_ms"] = 1e3 * time_fn(lambda: ref(x, ids.long(), n), reps=reps)
        row["torch_train_ms"] = 1e3 * time_fn(torch_step, reps=reps)
        row["torch_mem_mib"] = peak_memory_mib()
        row["torch_fwd_tflops"] = flop / row["torch_fwd_ms"] / 1e9
        row["fwd_speedup"] = row["torch_fwd_ms"] / row["tinn_fwd_ms"]
        row["train_speedup"] = row["torch_train_ms"] / row["tinn_train_ms"]
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None)
    p.add_argument("--networks", default=None, help="comma list (default GPU: 1,64,4096; CPU: 1,64)")
    p.add_argument("--log2-samples", default=None, help="comma list (default GPU: 20,22; CPU: 14)")
    p.add_argument("--widths", default="64")
    p.add_argument("--n-input", type=int, default=32)
    p.add_argument("--n-output", type=int, default=16)
    p.add_argument("--hidden-layers", type=int, default=2)
    p.add_argument("--routing", default="even", help="comma list of even, sorted, ragged")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip-torch", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    gpu = arch == "cuda"
    networks = [int(v) for v in (args.networks or ("1,64,4096" if gpu else "1,64")).split(",")]
    sizes = [int(v) for v in (args.log2_samples or ("20,22" if gpu else "14")).split(",")]
    rows = []
    for routing in args.routing.split(","):
        for width in [int(w) for w in args.widths.split(",")]:
            for n in networks:
                for s in sizes:
                    row = bench_case(n, s, width, args.n_input, args.n_output, args.hidden_layers, routing,
                                     args.reps, args.skip_torch)
                    rows.append(row)
                    print(row, flush=True)
    device = torch.cuda.get_device_name(0) if gpu else "cpu"
    print(f"\nMLP array: in={args.n_input} out={args.n_output} hidden={args.hidden_layers}, fp32, {device}")
    print_table(rows, [("networks", "N", "d"), ("width", "W", "d"), ("samples", "samples", "d"),
                       ("routing", "routing", "s"),
                       ("tinn_fwd_ms", "tinn fwd ms", ".2f"), ("torch_fwd_ms", "torch fwd ms", ".2f"),
                       ("tinn_fwd_tflops", "tinn TF/s", ".2f"), ("torch_fwd_tflops", "torch TF/s", ".2f"),
                       ("tinn_train_ms", "tinn step ms", ".2f"), ("torch_train_ms", "torch step ms", ".2f"),
                       ("train_speedup", "step x", ".2f"), ("tinn_train_samples_per_s", "tinn samples/s", ".3g"),
                       ("tinn_mem_mib", "tinn MiB", ".0f"), ("torch_mem_mib", "torch MiB", ".0f")])
    write_json(args.json, {"device": device, "arch": arch, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

"""A single network that the fused kernels do not take (more than 128 features, Sine, SiLU): Taichi's unfused
kernels against the dense GEMMs (`tuning.dense_single_network`), next to the same MLP in plain torch.

    python -m benchmarks.tools.single_network_paths [--shapes 256:ReLU:4,64:Sine:3,128:SiLU:2]
        [--log2-batch 18] [--precisions float16,bfloat16] [--json FILE]

Per shape (WIDTH:ACTIVATION:HIDDEN_LAYERS; 32 inputs, 16 outputs, L2 loss, Adam, input checks off) and path,
in one process: a Trainer step and an inference call, each as milliseconds per call with calls issued back
to back and one sync per block (median of blocks, rounds alternating between the paths); the step's host
time alone and its GPU time (the sum of its kernels, torch.profiler); and the relative
difference of the two paths' outputs and weight gradients. The torch row runs the same layers as an
`nn.Sequential` of bias-free `nn.Linear`s: forward, `backward()` of an L2 loss, and the fused `torch.optim.Adam`.
Each of `--precisions` adds the dense path in that `settings.precision` and the torch model under
`torch.autocast` to that dtype (float16: the loss scaled by 128, as tinn and tcnn scale it; Adam's update does
not depend on the scale); their differences are against the float32 dense path.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics


import torch  # noqa: E402

import tinn  # noqa: E402
from benchmarks.common import (cuda_kernels, host_ms_per_step, mlp_path, pipelined_ms, print_table,  # noqa: E402
                               settings_installed, write_json)

N_IN, N_OUT = 32, 16
TORCH_ACT = {"ReLU": torch.nn.ReLU, "Sine": None, "SiLU": torch.nn.SiLU, "Tanh": torch.nn.Tanh,
             "Sigmoid": torch.nn.Sigmoid, "Softplus": None}


class Sine(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x)


def torch_mlp(width: int, act: str, hidden: int, dev) -> torch.nn.Sequential:
    layers, fan_in = [], N_IN
    for _ in range(hidden):
        layers += [torch.nn.Linear(fan_in, width, bias=False), (TORCH_ACT.get(act) or Sine)()]
        fan_in = width
    layers.append(torch.nn.Linear(fan_in, N_OUT, bias=False))
    return torch.nn.Sequential(*layers).to(dev)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="256:ReLU:4,64:Sine:3,128:SiLU:2")
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--precisions", default="", help="comma-separated lower precisions: float16, bfloat16")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    arch = tinn.init()
    dev = tinn.runtime.device()
    base = tinn.settings.installed()
    batch = 1 << args.log2_batch
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(batch, N_IN, generator=gen) * 2 - 1).to(dev)
    t = torch.rand(batch, N_OUT, generator=gen).to(dev)
    rows = []
    precisions = [p for p in args.precisions.split(",") if p]
    for spec in args.shapes.split(","):
        width, act, hidden = spec.split(":")
        width, hidden = int(width), int(hidden)
        config = {"loss": {"otype": "L2"}, "optimizer": {"otype": "Adam", "learning_rate": 1e-3},
                  "encoding": {"otype": "Identity"},  # (a config without one gets tcnn's OneBlob)
                  "network": {"otype": "CutlassMLP", "n_neurons": width, "n_hidden_layers": hidden,
                              "activation": act, "output_activation": "None"}}
        tinn_paths = {}  # label -> (settings, trainer)
        variants = [("unfused kernels", {"dense_single_network": False}), ("dense GEMMs", {"dense_single_network": True})]
        variants += [(f"dense {p}", {"dense_single_network": True, "precision": p}) for p in precisions]
        for label, changes in variants:
            chosen = base.replace(**changes)
            with settings_installed(chosen):
                tinn_paths[label] = (chosen, tinn.Trainer.from_config(config, N_IN, N_OUT, seed=3))

        def inference(m):
            def run():
                with torch.no_grad():
                    m(x)
            return run

        def torch_path(precision):
            model = torch_mlp(width, act, hidden, dev)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, **({"fused": True} if dev.type == "cuda" else {}))
            dtype = tinn.dense_mlp.COMPUTE_DTYPES[precision]
            scale = tinn.dense_mlp.GRADIENT_SCALES[precision]

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=dtype, enabled=precision != "float32"):
                    y = model(x)
                ((y.float() - t) ** 2).mean().mul(scale).backward()
                opt.step()

            def infer():
                with torch.no_grad(), torch.autocast(dev.type, dtype=dtype, enabled=precision != "float32"):
                    model(x)
            return step, infer

        # Every path as (settings, path name, step, inference).
        paths = {label: (chosen, mlp_path(trainer.model.network)
                         + ("" if trainer.model.network.precision == "float32" else f" {trainer.model.network.precision}"),
                         lambda trainer=trainer: trainer.training_step(x, t), inference(trainer.model))
                 for label, (chosen, trainer) in tinn_paths.items()}
        for precision in ["float32"] + precisions:
            label = "torch" if precision == "float32" else f"torch {precision}"
            paths[label] = (base, label, *torch_path(precision))

        # The tinn paths' results on the same weights: outputs and weight gradients.
        outs, grads = {}, {}
        for label, (chosen, trainer) in tinn_paths.items():
            with settings_installed(chosen):
                m = trainer.model
                m.network.params.data.copy_(tinn_paths["unfused kernels"][1].model.network.params.data)
                m.zero_grad(set_to_none=True)
                y = m(x)
                ((y - t) ** 2).mean().backward()
                outs[label], grads[label] = y.detach(), m.network.params.grad.detach().clone()

        def rel(a, b):
            return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))

        timings = collections.defaultdict(list)
        with tinn.checks.disabled():
            for chosen, _, step, infer in paths.values():  # compile and warm up
                with settings_installed(chosen):
                    for _ in range(3):
                        step()
                        infer()
            for _ in range(args.rounds):
                for label, (chosen, _, step, infer) in paths.items():
                    with settings_installed(chosen):
                        timings[(label, "step")].append(pipelined_ms(step, args.steps))
                        timings[(label, "infer")].append(pipelined_ms(infer, args.steps))
            for label, (chosen, _, step, _) in paths.items():
                with settings_installed(chosen):
                    timings[(label, "host")].append(host_ms_per_step(step))
                    if arch == "cuda":
                        timings[(label, "gpu")].append(sum(r["ms"] for r in cuda_kernels(step)))
        for label, (_, path, _, _) in paths.items():
            row = {"shape": f"{width} {act} x{hidden}", "path": path,
                   "step_ms": statistics.median(timings[(label, "step")]),
                   "infer_ms": statistics.median(timings[(label, "infer")]),
                   "host_ms": timings[(label, "host")][0],
                   "gpu_ms": timings[(label, "gpu")][0] if arch == "cuda" else None}
            if label.startswith("dense"):  # the float32 dense path against the kernels, the others against it
                ref = "unfused kernels" if label == "dense GEMMs" else "dense GEMMs"
                row["out_diff"] = rel(outs[label], outs[ref])
                row["grad_diff"] = rel(grads[label], grads[ref])
            rows.append(row)
    for r in rows:
        ref = next(o for o in rows if o["shape"] == r["shape"] and o["path"] == "torch")
        r["step_x_torch"] = ref["step_ms"] / r["step_ms"]
    print(f"\n{arch}, single network, {N_IN} in, {N_OUT} out, batch 2^{args.log2_batch}")
    print_table(rows, [("shape", "shape", "s"), ("path", "path", "s"), ("step_ms", "step ms", ".3f"),
                       ("host_ms", "step host ms", ".3f"), ("gpu_ms", "step GPU ms", ".3f"),
                       ("infer_ms", "inference ms", ".3f"), ("step_x_torch", "x torch (step)", ".2f"),
                       ("out_diff", "output diff", ".1e"), ("grad_diff", "gradient diff", ".1e")])
    write_json(args.json, {"arch": arch, "log2_batch": args.log2_batch, "rows": rows})


if __name__ == "__main__":
    main()

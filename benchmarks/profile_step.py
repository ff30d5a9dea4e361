"""Per-kernel time of one MLP-array training step (Taichi's kernel profiler).

    python benchmarks/profile_step.py [NETWORKS=1,4096] [LOG2_SAMPLES=22] [WIDTHS=64]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tinn  # noqa: E402
from tinn.backend import ti  # noqa: E402

tinn.init(kernel_profiler=True)
from tinn.networks import NetworkArray  # noqa: E402
from tinn.trainer import Trainer  # noqa: E402

dev = tinn.runtime.device()
widths = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "64").split(",")]
cases = [(n, w) for n in [int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "1,4096").split(",")] for w in widths]
for n, width in cases:
    batch = 1 << int(sys.argv[2] if len(sys.argv) > 2 else 22)
    net = NetworkArray(32, 16, {"n_neurons": width, "n_hidden_layers": 2}, n_networks=n)
    trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam"})
    x = torch.rand(batch, 32, device=dev)
    y = torch.rand(batch, 16, device=dev)
    ids = (torch.arange(batch, device=dev) % n).to(torch.int32)
    with tinn.checks.disabled():
        for _ in range(3):
            trainer.training_step(x, y, ids)
        tinn.runtime.sync()
        ti.profiler.clear_kernel_profiler_info()
        for _ in range(5):
            trainer.training_step(x, y, ids)
        tinn.runtime.sync()
    print(f"== N={n} width={width} batch={batch} (5 steps)")
    ti.profiler.print_kernel_profiler_info("count")

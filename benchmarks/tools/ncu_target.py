"""A few iterations of the target case (4096 networks x 64 wide, 2^22 samples, even routing) for
Nsight Compute: forward-only calls, then training steps, so `ncu --kernel-name` can pick the fused
forward, the backward deltas and the weight gradients. Usage: `ncu --kernel-name regex:forward --launch-count 1 python3 -m benchmarks.tools.ncu_target`."""
import sys

import torch

import tinn  # noqa: E402

tinn.init()
from tinn.networks import NetworkArray  # noqa: E402
from tinn.trainer import Trainer  # noqa: E402

dev = tinn.runtime.device()
n, batch = 4096, 1 << int(sys.argv[1] if len(sys.argv) > 1 else 22)
net = NetworkArray(32, 16, {"n_neurons": 64, "n_hidden_layers": 2}, n_networks=n)
trainer = Trainer(net, {"otype": "L2"}, {"otype": "Adam"})
x = torch.rand(batch, 32, device=dev)
y = torch.rand(batch, 16, device=dev)
ids = (torch.arange(batch, device=dev) % n).to(torch.int32)
with tinn.checks.disabled(), torch.no_grad():
    for _ in range(3):
        net(x, ids)
with tinn.checks.disabled():
    for _ in range(3):
        trainer.training_step(x, y, ids)
tinn.runtime.sync()
print("done")

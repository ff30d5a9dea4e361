"""Fused against unfused kernels on one shape: which outputs differ, and where (sorted position in its tile).

    python benchmarks/debug/fused_diff.py n_in width n_out depth n_networks batch
"""
import sys

import torch

import tinn

tinn.init(arch="cuda")
from tinn.networks import NetworkArray  # noqa: E402

n_in, w, n_out, depth, N, B = map(int, sys.argv[1:7])
net = NetworkArray(n_in, n_out, {"n_neurons": w, "n_hidden_layers": depth}, n_networks=N)
gen = torch.Generator(device="cuda").manual_seed(0)
x = torch.rand(B, n_in, device="cuda", generator=gen) * 2 - 1
ids = torch.randint(0, N, (B,), device="cuda", dtype=torch.int32, generator=gen)
dy = torch.randn(B, n_out, device="cuda", generator=gen)


def run(fused):
    net.fused = fused
    xg = x.clone().requires_grad_()
    net.params.grad = None
    y = net(xg, ids)
    y.backward(dy)
    torch.cuda.synchronize()
    return y.detach(), xg.grad, net.params.grad.clone()


y1, dx1, dp1 = run(True)
y0, dx0, dp0 = run(False)
rel = lambda a, b: float((a - b).norm() / b.norm().clamp(min=1e-30))  # noqa: E731
print(f"shape {sys.argv[1:7]}: y {rel(y1, y0):.2e}  dx {rel(dx1, dx0):.2e}  dparams {rel(dp1, dp0):.2e}")
row_err = (dx1 - dx0).abs().max(1).values / dx0.abs().max().clamp(min=1e-30)
bad = torch.nonzero(row_err > 1e-4).flatten()
print("rows of dx off by > 1e-4 of max:", bad.numel(), "of", B)
if bad.numel():
    order = torch.argsort(ids.long(), stable=True)
    pos = torch.empty_like(order)
    pos[order] = torch.arange(B, device="cuda")
    p = pos[bad]
    ts = net.fused_geometry.tile
    print("  sorted positions:", p[:12].tolist())
    print("  position within tile histogram:", torch.bincount(p % ts, minlength=ts).tolist())
    print("  tile index of first:", (p[:12] // ts).tolist())
    cols = (dx1 - dx0)[bad].abs().max(0).values
    print("  per-input-column max error:", [round(float(c), 5) for c in cols])
dpe = (dp1 - dp0).abs().view(N, -1).max(0).values
print("largest dparams errors at flat index:", torch.topk(dpe, 5).indices.tolist(), torch.topk(dpe, 5).values.tolist())

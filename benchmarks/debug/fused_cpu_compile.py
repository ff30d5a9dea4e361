# Front-end compile check of one CUDA-only fused kernel on the CPU (sync patched out); "Symbols not found:
# shared_array" at JIT link time means the front end and LLVM codegen went through.
import sys, torch, taichi as ti
import tinn
tinn.init(arch="cpu")
@ti.func
def _nosync():
    pass
ti.simt.block.sync = _nosync
from tinn.kernels import mlp_fused as FK
from tinn.kernels.mlp_array import layer_shapes
from tinn.routing import route_fused
which = sys.argv[1]
n_in, w, n_out, depth, N, B, want_dx = 32, 64, 16, 2, 8, 700, True
if len(sys.argv) > 2:
    n_in, w, n_out, depth = map(int, sys.argv[2:6]); want_dx = sys.argv[6] == "1"
L = depth + 1
g = FK.geometry(n_in, w, n_out, L)
ids = torch.randint(0, N, (B,), dtype=torch.int32)
tiles, chunks = route_fused(ids, N, (g.tile, FK.grad_chunk(B)))
P = sum(o * i for o, i in layer_shapes(n_in, w, n_out, L))
params = torch.rand(N, P); x = torch.rand(B, n_in); acts = torch.rand(max(L - 1, 1), w, B); out = torch.rand(B, n_out)
deltas = torch.rand(L, max(w, n_out), B); dx = torch.zeros(B, n_in); dp = torch.zeros_like(params)
if which == "fwd":
    FK.forward(x, tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count, params, acts, out, n_in, w, n_out, L, 1, 0, True, g.tile, False, g.features, False)
elif which == "deltas":
    FK.backward_deltas(out, tiles.order, tiles.tile_net, tiles.tile_start, tiles.tile_count, params, acts, out, deltas, dx, n_in, w, n_out, L, 1, 0, want_dx, g.tile, g.features, False)
else:
    FK.weight_gradients(x, chunks.order, chunks.tile_net, chunks.tile_start, chunks.tile_count, acts, deltas, dp, n_in, w, n_out, L, g.features, False)
print("ran (unexpected on CPU)")

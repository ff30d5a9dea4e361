import sys, torch, os
import tinn
tinn.init(arch="cuda", debug=os.environ.get("DBG") == "1")
from tinn.networks import NetworkArray
sys.path.insert(0, "tests")
from reference import mlp_array, rel_err
n_in, w, n_out, depth, N, B = map(int, sys.argv[1:7])
stage = sys.argv[7]
net = NetworkArray(n_in, n_out, {"n_neurons": w, "n_hidden_layers": depth, "activation": "ReLU", "output_activation": "None"}, n_networks=N)
x = torch.rand(B, n_in, device="cuda") * 2 - 1
ids = torch.randint(0, N, (B,), device="cuda", dtype=torch.int32)
ref = mlp_array(net, net.params.detach().double(), x.double(), ids, "ReLU", "None")
with torch.no_grad():
    y = net(x, ids); torch.cuda.synchronize()
print("inference err", rel_err(y, ref), flush=True)
if stage == "fwd": sys.exit()
xg = x.clone().requires_grad_()
y = net(xg, ids); torch.cuda.synchronize()
print("train fwd err", rel_err(y.detach(), ref), flush=True)
y.backward(torch.ones_like(y)); torch.cuda.synchronize()
p64 = net.params.detach().double().requires_grad_(); x64 = x.double().requires_grad_()
mlp_array(net, p64, x64, ids, "ReLU", "None").backward(torch.ones(B, n_out, device="cuda", dtype=torch.float64))
print("bwd err dparams", rel_err(net.params.grad, p64.grad), "dx", rel_err(xg.grad, x64.grad), flush=True)

"""A float64 model of the tensor-core MLP kernels' rounding (tinn/kernels/tensor_cores): the reference that
their 16-bit precisions are compared with closely (against exact float64 they differ by their rounding alone,
which a deep ReLU network amplifies in dx and dparams: a pre-activation rounded across zero flips a mask).

Rounded to the compute dtype, as the kernels round: the inputs and weights, each hidden pre-activation and
activation, the output delta (after the gradient scale) and each hidden delta. Everything else is float64;
the kernels accumulate in float32, a difference far below the 16-bit roundings.
"""
import torch

from reference import activation


def _derivative(name: str, z: torch.Tensor) -> torch.Tensor:
    z = z.detach().requires_grad_()
    with torch.enable_grad():
        (g,) = torch.autograd.grad(activation(name, z).sum(), z)
    return g


def emulated(net, x: torch.Tensor, ids: torch.Tensor, dy: torch.Tensor, hidden: str, output: str,
             dtype: torch.dtype, gradient_scale: float = 1.0):
    """(out, dx, dparams) of `net`'s parameters as the kernels compute them in `dtype` (float32 for TF32 and
    float32, where this is float64 with float32 operands)."""
    q = lambda t: t.to(dtype).double()  # noqa: E731
    params = net.params.detach()
    n_pad, value = net.input_padding
    xd = x.double()
    h_all = torch.cat([xd, xd.new_full((xd.shape[0], n_pad), value)], 1) if n_pad else xd
    out = torch.zeros(x.shape[0], net.n_output_dims, dtype=torch.float64, device=x.device)
    dx = torch.zeros(x.shape[0], net.kernel_inputs, dtype=torch.float64, device=x.device)
    dparams = torch.zeros(params.shape, dtype=torch.float64, device=x.device)
    last = net.n_layers - 1
    for n in range(net.n_networks):
        rows = (ids.long() == n).nonzero()[:, 0]
        if not rows.numel():
            continue
        ws = [q(net.weights(l, params)[n][:net.n_output_dims if l == last else None]) for l in range(net.n_layers)]
        h = q(h_all[rows])
        inputs, pre = [h], []
        for l in range(last):
            z = q(h @ ws[l].t())
            h = q(activation(hidden, z))
            pre.append(z)
            inputs.append(h)
        z_out = h @ ws[last].t()
        out[rows] = activation(output, z_out)
        delta = q(dy[rows].double() * gradient_scale * _derivative(output, z_out))
        offsets = [0]
        for fan_out, fan_in in net.layer_shapes():
            offsets.append(offsets[-1] + fan_out * fan_in)
        for l in range(last, -1, -1):
            dw = delta.t() @ inputs[l] / gradient_scale
            dparams[n, offsets[l]:offsets[l] + dw.numel()] = dw.reshape(-1)
            dh = delta @ ws[l]
            if l:
                delta = q(dh * _derivative(hidden, pre[l - 1]))
            else:
                dx[rows] = dh / gradient_scale
    return out, dx[:, :net.n_input_dims], dparams

"""Independent float64 PyTorch re-implementations used as test references."""
import torch

K_ACT = 10.0


def activation(name: str, z: torch.Tensor) -> torch.Tensor:
    if name == "None":
        return z
    if name == "ReLU":
        return torch.relu(z)
    if name == "LeakyReLU":
        return torch.where(z > 0, z, 0.01 * z)
    if name == "Exponential":
        return torch.exp(z)
    if name == "Sine":
        return torch.sin(z)
    if name == "Sigmoid":
        return torch.sigmoid(z)
    if name == "Squareplus":
        s = z * K_ACT
        return 0.5 * (s + torch.sqrt(s * s + 4)) / K_ACT
    if name == "Softplus":
        return torch.nn.functional.softplus(z * K_ACT) / K_ACT
    if name == "Tanh":
        return torch.tanh(z)
    if name == "SiLU":
        return torch.nn.functional.silu(z)
    raise ValueError(name)


def mlp_array(net, params: torch.Tensor, x: torch.Tensor, ids: torch.Tensor, hidden: str, output: str):
    """Per-sample MLP: gathers each sample's weight matrices and applies them in float64 (after the
    network's constant input columns, tcnn's padding, when it has them)."""
    n_pad, value = getattr(net, "input_padding", (0, 0.0))
    h = torch.cat([x, x.new_full((x.shape[0], n_pad), value)], dim=1) if n_pad else x
    idx = ids.long()
    for l in range(net.n_layers):
        w = net.weights(l, params)[idx]  # (batch, out, in)
        z = torch.einsum("boi,bi->bo", w, h)
        h = activation(output if l == net.n_layers - 1 else hidden, z)
    return h[:, :net.n_output_dims]  # (tcnn's padded output rows, when the network has them, are dropped)


def mlp_array_float64(net, x: torch.Tensor, ids: torch.Tensor, dy: torch.Tensor, hidden: str, output: str):
    """`mlp_array` on the network's weights and x in float64, backpropagated from dy: (y, dL/dx, dL/dparams)."""
    p64 = net.params.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y64 = mlp_array(net, p64, x64, ids, hidden, output)
    y64.backward(dy.double())
    return y64.detach(), x64.grad, p64.grad


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def forward_backward(net, x: torch.Tensor, dy: torch.Tensor):
    """A single network called as a module on a copy of x and backpropagated from dy: (y, dL/dx, dL/dparams)."""
    x = x.clone().requires_grad_()
    net.params.grad = None
    y = net(x, None)
    y.backward(dy)
    return y.detach(), x.grad, net.params.grad.clone()


def record_gradient_pointers(part) -> list:
    """Wraps `part.backward` so that each call appends the data pointer of the first table gradient it returned
    (the buffer autograd should adopt as `.grad`); returns that list."""
    returned = []
    backward = part.backward

    def recording_backward(ctx, dy, **kw):
        dx, grads = backward(ctx, dy, **kw)
        returned.append(grads[0].data_ptr())
        return dx, grads

    part.backward = recording_backward
    return returned


def check_loss_inside_backward(net, x, ids, t, loss, value64, hidden: str, output: str, tol: float) -> None:
    """`net.backward_from_loss` (the loss's gradient taken inside the backward's kernels) against the loss kernel
    followed by `backward` (to float32 rounding) and against float64 autograd of `value64(pred, target, pdf)`, the
    per-element loss (within `tol`): the mean loss, dx and the parameter gradient."""
    y, ctx = net.forward_with_context(x, ids, train=True)
    dx, (dp,), value = net.backward_from_loss(ctx, y, loss, t, need_dx=True)
    y2, ctx2 = net.forward_with_context(x, ids, train=True)
    result = loss.evaluate(y2, t)
    dx2, (dp2,) = net.backward(ctx2, result.grad, need_dx=True)
    assert value.dim() == 0 and abs(float(value) - float(result.value)) <= 1e-5 * abs(float(result.value))
    assert rel_err(dp, dp2) < 1e-5 and rel_err(dx, dx2) < 1e-5
    p64 = net.params.detach().double().requires_grad_()
    x64 = x.double().requires_grad_()
    y64 = mlp_array(net, p64, x64, ids, hidden, output)
    v64 = value64(y64, t.double(), torch.ones_like(y64)).mean()
    v64.backward()
    assert abs(float(value) - float(v64.detach())) <= 1e-4 * abs(float(v64.detach()))
    assert rel_err(dp, p64.grad) < tol and rel_err(dx, x64.grad) < tol

"""Kernels around a user's per-sample functions (tinn/autodiff.py); Taichi derives their `.grad`.

One kernel per function (the function is baked into the kernel); samples run one thread each, in the
caller's order (ids may come in any order). With gradient replicas the parameter table holds R stacked
copies of its rows and sample b reads copy b mod R, so its parameter gradients land in copy b mod R.
"""
from ..backend import ti

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)


def sample_kernel(func):
    """A kernel over samples calling `func(x, p, b, net, y)`."""

    @ti.kernel
    def per_sample(x: f32_2d, ids: i32_1d, p: f32_2d, y: f32_2d, n_networks: ti.i32, replicas: ti.i32):
        for b in range(x.shape[0]):
            func(x, p, b, ids[b] + n_networks * (b % replicas), y)

    return per_sample


def tangent_kernel(tangent):
    """A kernel over samples calling the forward-mode function `tangent(x, xt, p, b, net, yt)`
    (kernels/autodiff_source.py): yt = J(x, p) xt per sample. Its `.grad` gives second derivatives."""

    @ti.kernel
    def per_sample_tangent(x: f32_2d, xt: f32_2d, ids: i32_1d, p: f32_2d, yt: f32_2d, n_networks: ti.i32,
                           replicas: ti.i32):
        for b in range(x.shape[0]):
            tangent(x, xt, p, b, ids[b] + n_networks * (b % replicas), yt)

    return per_sample_tangent


def loss_kernel(func):
    """A kernel over elements calling the loss function `func(pred, target, b, d, l)`: one thread per
    element (b, d), as tinn's hand-written loss kernel, so no loop over the row is differentiated."""

    @ti.kernel
    def per_element_loss(pred: f32_2d, target: f32_2d, value: f32_2d):
        for b, d in ti.ndrange(pred.shape[0], pred.shape[1]):
            func(pred, target, b, d, value)

    return per_element_loss

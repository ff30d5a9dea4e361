"""The kernel around a user's per-sample function (tinn/autodiff.py); Taichi derives its `.grad`."""
from ..backend import ti

f32_2d = ti.types.ndarray(dtype=ti.f32, ndim=2)
i32_1d = ti.types.ndarray(dtype=ti.i32, ndim=1)


def sample_kernel(func):
    """A kernel over samples calling `func(x, p, b, net, y)`; one instance per function."""

    @ti.kernel
    def per_sample(x: f32_2d, ids: i32_1d, p: f32_2d, y: f32_2d, n_networks: ti.i32, replicas: ti.i32):
        for b in range(x.shape[0]):
            # With replicas the table holds R stacked copies of the rows; sample b reads copy b mod R.
            func(x, p, b, ids[b] + n_networks * (b % replicas), y)

    return per_sample


def element_kernel(func):
    """A kernel over (sample, channel) calling `func(pred, target, b, c, out)`; its `.grad` is Taichi's reverse
    mode of it."""

    @ti.kernel
    def per_element(pred: f32_2d, target: f32_2d, out: f32_2d):
        for b, c in ti.ndrange(pred.shape[0], pred.shape[1]):
            func(pred, target, b, c, out)

    return per_element

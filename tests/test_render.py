"""Rays, ray-box, sampling, packing and compositing (forward and backward against float64 torch references)."""
import math

import pytest
import torch

import tinn
from tinn.errors import InputError
from tinn.render import camera_rays, composite, composite_dense, pack, pixel_radius, ray_box, stratified_t

from conftest import record_launches

DEV = tinn.runtime.device()


# ---------------------------------------------------------------------------------------------------------
# Rays
# ---------------------------------------------------------------------------------------------------------
def test_camera_rays_match_hand_computed_rays():
    # Camera at (1, 2, 3) turned 90 degrees about +y: camera -z (forward) looks along world -x, camera +x is world -z.
    c2w = torch.tensor([[0.0, 0.0, 1.0, 1.0],
                        [0.0, 1.0, 0.0, 2.0],
                        [-1.0, 0.0, 0.0, 3.0],
                        [0.0, 0.0, 0.0, 1.0]], device=DEV)
    origins, dirs = camera_rays(c2w, width=4, height=2, focal=2.0)
    assert origins.shape == (8, 3) and dirs.shape == (8, 3)
    assert torch.equal(origins, torch.tensor([[1.0, 2.0, 3.0]], device=DEV).expand(8, 3))
    # Pixel (i=0, j=0): camera direction ((0.5 - 2) / 2, -(0.5 - 1) / 2, -1) = (-0.75, 0.25, -1)
    # -> world (x, y, z) = (cam_z, cam_y, -cam_x) = (-1, 0.25, 0.75), normalised by sqrt(1 + 1/16 + 9/16).
    n = math.sqrt(1 + 0.0625 + 0.5625)
    torch.testing.assert_close(dirs[0], torch.tensor([-1.0, 0.25, 0.75], device=DEV) / n)
    # Pixel (i=3, j=1) is ray 1 * 4 + 3 = 7: camera (1.5 - ... ) = ((3.5 - 2) / 2, -(1.5 - 1) / 2, -1) = (0.75, -0.25, -1).
    torch.testing.assert_close(dirs[7], torch.tensor([-1.0, -0.25, -0.75], device=DEV) / n)
    # Row-major: ray 1 is pixel (i=1, j=0): camera (-0.25, 0.25, -1) -> world (-1, 0.25, 0.25).
    torch.testing.assert_close(dirs[1], torch.tensor([-1.0, 0.25, 0.25], device=DEV) / math.sqrt(1 + 0.0625 + 0.0625))
    torch.testing.assert_close(dirs.norm(dim=1), torch.ones(8, device=DEV))


def test_camera_rays_are_view_major():
    a = torch.eye(4, device=DEV)
    b = torch.eye(4, device=DEV)
    b[:3, 3] = torch.tensor([0.0, 0.0, 4.0], device=DEV)
    origins, dirs = camera_rays(torch.stack([a, b]), width=3, height=2, focal=5.0)
    o_b, d_b = camera_rays(b, 3, 2, 5.0)
    assert origins.shape == (12, 3)
    torch.testing.assert_close(origins[6:], o_b)
    torch.testing.assert_close(dirs[6:], d_b)
    # The centre column of an odd-width image looks straight ahead in x.
    assert float(dirs[1, 0]) == 0.0 and float(dirs[1, 1]) > 0 and float(dirs[1, 2]) < 0
    assert pixel_radius(100.0) == pytest.approx(0.005)


def test_camera_rays_reject_bad_input():
    with pytest.raises(InputError, match="c2w"):
        camera_rays(torch.eye(3, device=DEV), 4, 4, 1.0)
    with pytest.raises(InputError, match="focal"):
        camera_rays(torch.eye(4, device=DEV), 4, 4, 0.0)
    with pytest.raises(InputError, match="width"):
        camera_rays(torch.eye(4, device=DEV), 0, 4, 1.0)


def test_ray_box_hits_and_misses():
    s = 1 / math.sqrt(2)
    origins = torch.tensor([[0.0, 0.0, -5.0],    # straight through: enters at 4, leaves at 6
                            [0.0, 0.5, 0.0],     # starts inside: t_near clamped to 0, leaves at 1
                            [0.0, 5.0, -5.0],    # passes above the box
                            [0.0, 0.0, 5.0],     # box behind the ray
                            [-3.0, -3.0, 0.0],   # diagonal: enters at 2 sqrt2, leaves at 4 sqrt2
                            [0.0, 1.5, 0.0]], device=DEV)    # parallel to a face, outside it
    dirs = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [s, s, 0.0],
                         [1.0, 0.0, 0.0]], device=DEV)
    t_near, t_far = ray_box(origins, dirs, torch.tensor([-1.0, -1.0, -1.0], device=DEV), (1.0, 1.0, 1.0))
    torch.testing.assert_close(t_near[[0, 1, 4]], torch.tensor([4.0, 0.0, 2 * math.sqrt(2)], device=DEV))
    torch.testing.assert_close(t_far[[0, 1, 4]], torch.tensor([6.0, 1.0, 4 * math.sqrt(2)], device=DEV))
    assert bool((t_far[[2, 3, 5]] <= t_near[[2, 3, 5]]).all())
    assert bool((t_near >= 0).all()) and bool(torch.isfinite(t_near).all())
    with pytest.raises(InputError, match="box_max"):
        ray_box(origins, dirs, (1.0, 1.0, 1.0), (-1.0, -1.0, -1.0))
    with pytest.raises(InputError, match="directions"):
        ray_box(origins, dirs[:2], (-1.0,) * 3, (1.0,) * 3)


# ---------------------------------------------------------------------------------------------------------
# Sampling and packing
# ---------------------------------------------------------------------------------------------------------
def test_stratified_t_midpoints_jitter_and_misses():
    t_near = torch.tensor([1.0, 2.0, 3.0], device=DEV)
    t_far = torch.tensor([3.0, 2.5, 1.0], device=DEV)  # the last ray misses
    t, deltas = stratified_t(t_near, t_far, 4, jitter=False)
    torch.testing.assert_close(t[0], torch.tensor([1.25, 1.75, 2.25, 2.75], device=DEV))
    torch.testing.assert_close(deltas[0], torch.full((4,), 0.5, device=DEV))
    torch.testing.assert_close(deltas[1], torch.full((4,), 0.125, device=DEV))
    assert bool((deltas[2] == 0).all())
    g = torch.Generator(device=DEV).manual_seed(3)  # stratified_t draws on the rays' device
    tj, dj = stratified_t(t_near, t_far, 4, jitter=True, generator=g)
    torch.testing.assert_close(dj, deltas)
    edges = t_near[:2, None] + torch.arange(4, device=DEV)[None] * deltas[:2]
    assert bool((tj[:2] >= edges).all()) and bool((tj[:2] <= edges + deltas[:2]).all())
    assert not torch.equal(tj, t)
    tj2, _ = stratified_t(t_near, t_far, 4, jitter=True, generator=torch.Generator(device=DEV).manual_seed(3))
    assert torch.equal(tj, tj2)


def test_pack_keeps_masked_samples_front_to_back():
    mask = torch.tensor([[True, False, True, True],
                         [False, False, False, False],
                         [False, True, False, False]], device=DEV)
    index, offsets = pack(mask)
    assert index.dtype == torch.int64 and offsets.dtype == torch.int32
    assert index.tolist() == [0, 2, 3, 9]
    assert offsets.tolist() == [0, 3, 3, 4]
    with pytest.raises(InputError, match="mask"):
        pack(mask.int())


# ---------------------------------------------------------------------------------------------------------
# Compositing
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(params=["taichi", "triton"])
def compositing_path(request, tuned, monkeypatch):
    """Compositing's two launch paths (`tuning.triton_render_kernels`): Taichi's kernels, and Triton's (the CUDA
    default; its interpreter on the CPU) with blocks of 4 samples, so that rays span one block, several, or a
    last one partly filled. A test on the Triton path must have launched them."""
    launches = []
    if request.param == "triton":
        from tinn.kernels import triton_available
        if not triton_available():
            pytest.skip("Triton is not installed")
        from tinn.kernels import compositing_triton
        monkeypatch.setattr(compositing_triton, "BLOCK", 4)
        launches = record_launches(monkeypatch, compositing_triton, ("composite_forward", "composite_backward"))
    tuned(triton_render_kernels=request.param == "triton")
    yield request.param
    if request.param == "triton":
        assert launches, "the Triton compositing was never launched"


def ref_composite(sigma, rgb, deltas, offsets, background, t):
    """The compositing formula, ray by ray, in plain torch (float64 inputs give a float64 reference)."""
    out_rgb, out_op, out_depth = [], [], []
    for r in range(len(offsets) - 1):
        a, b = int(offsets[r]), int(offsets[r + 1])
        alpha = 1 - torch.exp(-sigma[a:b] * deltas[a:b])
        trans = torch.cumprod(torch.cat([alpha.new_ones(1), 1 - alpha]), 0)[:-1]
        w = trans * alpha
        bg = background if background.dim() == 1 else background[r]
        out_rgb.append((w[:, None] * rgb[a:b]).sum(0) + (1 - w.sum()) * bg)
        out_op.append(w.sum())
        out_depth.append((w * t[a:b]).sum())
    return torch.stack(out_rgb), torch.stack(out_op), torch.stack(out_depth)


def make_rays(seed=0):
    """Rays with 3, 0, 1, 7, 5 and 12 samples: thin media, dense media, an empty ray."""
    g = torch.Generator().manual_seed(seed)
    counts = [3, 0, 1, 7, 5, 12]
    m = sum(counts)
    offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)
    sigma = torch.rand(m, generator=g) * 4
    sigma[3] = 60.0                     # the 1-sample ray is almost opaque
    sigma[4:11] = torch.rand(7, generator=g) * 0.002  # a ray of very thin medium (series branch of 1 - exp(-x))
    deltas = torch.rand(m, generator=g) * 0.3 + 0.05
    rgb = torch.rand(m, 3, generator=g)
    t = torch.cat([torch.cumsum(deltas[int(offsets[r]):int(offsets[r + 1])], 0) + 1 for r in range(len(counts))])
    return (*(x.to(DEV) for x in (sigma, rgb, deltas, offsets, t)), g)


@pytest.mark.parametrize("bg_kind", ["none", "shared", "per_ray"])
def test_composite_forward_matches_formula(bg_kind, compositing_path):
    sigma, rgb, deltas, offsets, t, g = make_rays()
    n_rays = len(offsets) - 1
    bg = {"none": None, "shared": torch.tensor([0.2, 0.5, 0.9]), "per_ray": torch.rand(n_rays, 3, generator=g)}[bg_kind]
    bg = None if bg is None else bg.to(DEV)
    out = composite(sigma, rgb, deltas, offsets, background=bg, t=t)
    bg64 = torch.zeros(3, dtype=torch.float64, device=DEV) if bg is None else bg.double()
    ref_rgb, ref_op, ref_depth = ref_composite(sigma.double(), rgb.double(), deltas.double(), offsets, bg64, t.double())
    torch.testing.assert_close(out.rgb.double(), ref_rgb, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.opacity.double(), ref_op, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.depth.double(), ref_depth, rtol=1e-5, atol=1e-6)
    # The empty ray shows the background only; the thin ray's opacity is tiny but exact in relative terms.
    torch.testing.assert_close(out.rgb[1].double(), bg64 if bg64.dim() == 1 else bg64[1])
    assert float(out.opacity[1]) == 0.0
    torch.testing.assert_close(out.opacity[3].double(), ref_op[3], rtol=1e-5, atol=0)
    assert composite(sigma, rgb, deltas, offsets).depth is None


@pytest.mark.parametrize("bg_kind", ["shared", "per_ray"])
def test_composite_gradients_match_autograd(bg_kind, compositing_path):
    sigma, rgb, deltas, offsets, t, g = make_rays(1)
    n_rays = len(offsets) - 1
    bg = torch.tensor([0.3, 0.6, 0.1]) if bg_kind == "shared" else torch.rand(n_rays, 3, generator=g)
    g_rgb = torch.randn(n_rays, 3, generator=g)
    g_op = torch.randn(n_rays, generator=g)
    g_depth = torch.randn(n_rays, generator=g)
    bg, g_rgb, g_op, g_depth = (x.to(DEV) for x in (bg, g_rgb, g_op, g_depth))

    leaves = [x.clone().requires_grad_() for x in (sigma, rgb, deltas, t, bg)]
    out = composite(leaves[0], leaves[1], leaves[2], offsets, background=leaves[4], t=leaves[3])
    loss = (out.rgb * g_rgb).sum() + (out.opacity * g_op).sum() + (out.depth * g_depth).sum()
    grads = torch.autograd.grad(loss, leaves)

    leaves64 = [x.double().requires_grad_() for x in (sigma, rgb, deltas, t, bg)]
    r_rgb, r_op, r_depth = ref_composite(leaves64[0], leaves64[1], leaves64[2], offsets, leaves64[4], leaves64[3])
    loss64 = (r_rgb * g_rgb.double()).sum() + (r_op * g_op.double()).sum() + (r_depth * g_depth.double()).sum()
    refs = torch.autograd.grad(loss64, leaves64)
    for name, got, ref in zip(("sigma", "rgb", "deltas", "t", "background"), grads, refs):
        assert got.shape == ref.shape, name
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    # The opaque 1-sample ray hides everything behind: its sample's colour gets (almost) the whole gradient.
    assert float(grads[1][3].norm()) == pytest.approx(float(g_rgb[2].norm()), rel=1e-4)


def test_composite_gradients_only_where_asked(compositing_path):
    """Each input asked for alone gets the float64 reference's gradient, the others none; without `t` there
    is no depth."""
    sigma, rgb, deltas, offsets, t, g = make_rays(2)
    bg = torch.ones(3, device=DEV)
    weights = torch.randn(len(offsets) - 1, 3, generator=g).to(DEV)
    inputs = {"sigma": sigma, "rgb": rgb, "deltas": deltas}
    for asked in inputs:
        leaves = {k: v.clone().requires_grad_(k == asked) for k, v in inputs.items()}
        out = composite(leaves["sigma"], leaves["rgb"], leaves["deltas"], offsets, background=bg)
        assert out.depth is None
        (out.rgb * weights).sum().backward()
        ref = {k: v.double().requires_grad_(k == asked) for k, v in inputs.items()}
        r_rgb = ref_composite(ref["sigma"], ref["rgb"], ref["deltas"], offsets, bg.double(), t.double())[0]
        (r_rgb * weights.double()).sum().backward()
        torch.testing.assert_close(leaves[asked].grad.double(), ref[asked].grad, rtol=1e-4, atol=1e-6)
        assert all(leaves[k].grad is None for k in inputs if k != asked)


def test_composite_background_as_numbers_equals_the_tensor(compositing_path):
    """A background given as numbers composites as the same tensor would (and None as black); a render
    loop passing the same numbers reuses one device tensor instead of copying them every call."""
    sigma, rgb, deltas, offsets, t, _ = make_rays(5)
    as_tensor = composite(sigma, rgb, deltas, offsets, background=torch.tensor([0.25, 0.5, 1.0], device=DEV), t=t)
    as_numbers = composite(sigma, rgb, deltas, offsets, background=(0.25, 0.5, 1), t=t)
    assert torch.equal(as_numbers.rgb, as_tensor.rgb) and torch.equal(as_numbers.depth, as_tensor.depth)
    black = composite(sigma, rgb, deltas, offsets, t=t)
    assert torch.equal(black.rgb, composite(sigma, rgb, deltas, offsets, background=torch.zeros(3, device=DEV), t=t).rgb)
    from tinn.render.compositing import _constant_background
    assert _constant_background([0.25, 0.5, 1.0], sigma.device) is _constant_background((0.25, 0.5, 1), sigma.device)
    per_ray = [[0.25, 0.5, 1.0]] * (offsets.shape[0] - 1)  # per-ray colours as nested lists: converted each call
    assert torch.equal(composite(sigma, rgb, deltas, offsets, background=per_ray, t=t).rgb, as_tensor.rgb)


def test_composite_dense_equals_packed(compositing_path):
    g = torch.Generator().manual_seed(4)
    n_rays, n_samples = 5, 9
    sigma = (torch.rand(n_rays, n_samples, generator=g) * 3).to(DEV)
    rgb = torch.rand(n_rays, n_samples, 3, generator=g).to(DEV)
    deltas = torch.full((n_rays, n_samples), 0.2, device=DEV)
    deltas[2] = 0.0  # a missed ray
    t = torch.cumsum(deltas, 1)
    bg = torch.tensor([1.0, 1.0, 1.0], device=DEV)
    dense = composite_dense(sigma, rgb, deltas, background=bg, t=t)
    offsets = torch.arange(n_rays + 1, dtype=torch.int32, device=DEV) * n_samples
    packed = composite(sigma.reshape(-1), rgb.reshape(-1, 3), deltas.reshape(-1), offsets, background=bg, t=t.reshape(-1))
    assert torch.equal(dense.rgb, packed.rgb) and torch.equal(dense.opacity, packed.opacity)
    assert torch.equal(dense.depth, packed.depth)
    torch.testing.assert_close(dense.rgb[2], bg)
    ref_rgb, _, _ = ref_composite(sigma.reshape(-1).double(), rgb.reshape(-1, 3).double(), deltas.reshape(-1).double(),
                                  offsets, bg.double(), t.reshape(-1).double())
    torch.testing.assert_close(dense.rgb.double(), ref_rgb, rtol=1e-5, atol=1e-6)


def test_composite_long_rays_match_float64_on_both_paths(compositing_path):
    """Rays longer than a block (Triton's: several blocks of 4 here, the transmittance and the suffix sums carried
    across them): a 300-sample ray through thin medium, one that turns opaque part-way (T underflows to 0), and a
    ray of one sample, forward and every gradient against the float64 reference."""
    g = torch.Generator().manual_seed(11)
    counts = [300, 57, 1, 30]
    m = sum(counts)
    offsets = torch.tensor([0] + list(torch.tensor(counts).cumsum(0)), dtype=torch.int32)
    sigma = torch.rand(m, generator=g) * 0.05
    sigma[300 + 20:300 + 25] = 400.0  # an opaque wall inside the second ray
    sigma[358:] = torch.rand(30, generator=g) * 3
    deltas = torch.rand(m, generator=g) * 0.05 + 0.01
    rgb, t = torch.rand(m, 3, generator=g), torch.rand(m, generator=g) * 4
    bg = torch.rand(len(counts), 3, generator=g)
    g_rgb, g_op, g_depth = torch.randn(len(counts), 3, generator=g), torch.randn(len(counts), generator=g), \
        torch.randn(len(counts), generator=g)
    leaves = [x.to(DEV).requires_grad_() for x in (sigma, rgb, deltas, t, bg)]
    out = composite(leaves[0], leaves[1], leaves[2], offsets.to(DEV), background=leaves[4], t=leaves[3])
    loss = (out.rgb * g_rgb.to(DEV)).sum() + (out.opacity * g_op.to(DEV)).sum() + (out.depth * g_depth.to(DEV)).sum()
    grads = torch.autograd.grad(loss, leaves)
    leaves64 = [x.double().requires_grad_() for x in (sigma, rgb, deltas, t, bg)]
    ref = ref_composite(leaves64[0], leaves64[1], leaves64[2], offsets, leaves64[4], leaves64[3])
    for got, want in zip((out.rgb, out.opacity, out.depth), ref):
        torch.testing.assert_close(got.detach().cpu().double(), want.detach(), rtol=1e-5, atol=1e-5)
    loss64 = (ref[0] * g_rgb.double()).sum() + (ref[1] * g_op.double()).sum() + (ref[2] * g_depth.double()).sum()
    for name, got, want in zip(("sigma", "rgb", "deltas", "t", "background"), grads,
                               torch.autograd.grad(loss64, leaves64)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert float(out.opacity[1]) == pytest.approx(1.0, abs=1e-6)  # the wall stops the second ray


def test_composite_infinite_density_makes_its_sample_opaque(compositing_path):
    """A density that overflowed to inf (exp of a large raw output) hides what lies behind it, on both paths as in
    the float64 reference: finite colours, opacity 1, and the colour gradients of the samples behind it zero."""
    sigma, rgb, deltas, offsets, t, g = make_rays(3)
    sigma = sigma.clone()
    sigma[5] = float("inf")  # the second sample of the 7-sample ray (samples 4 to 10)
    rgb = rgb.clone().requires_grad_()
    out = composite(sigma, rgb, deltas, offsets, background=torch.ones(3, device=DEV), t=t)
    ref = ref_composite(sigma.double(), rgb.detach().double(), deltas.double(), offsets,
                        torch.ones(3, dtype=torch.float64, device=DEV), t.double())
    for got, want in zip((out.rgb, out.opacity, out.depth), ref):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-5, atol=1e-6)
    assert float(out.opacity[3]) == pytest.approx(1.0, abs=1e-6)  # a sum of weights, rounded
    (g_rgb,) = torch.autograd.grad(out.rgb.sum(), rgb)
    assert torch.isfinite(g_rgb).all() and float(g_rgb[6:11].abs().max()) == 0.0


def test_composite_rejects_bad_input():
    sigma, rgb, deltas, offsets, t, _ = make_rays()
    with pytest.raises(InputError, match="rgb must have shape"):
        composite(sigma, rgb[:-1], deltas, offsets)
    with pytest.raises(InputError, match="deltas must have shape"):
        composite(sigma, rgb, deltas[:, None], offsets)
    with pytest.raises(InputError, match="sigma has dtype"):
        composite(sigma.double(), rgb, deltas, offsets)
    with pytest.raises(InputError, match="ray_offsets has dtype"):
        composite(sigma, rgb, deltas, offsets.long())
    with pytest.raises(InputError, match="end at M"):
        composite(sigma, rgb, deltas, offsets[:-1])
    bad = offsets.clone()
    bad[2], bad[3] = bad[3], bad[2] - 1
    with pytest.raises(InputError, match="non-decreasing"):
        composite(sigma, rgb, deltas, bad)
    with pytest.raises(InputError, match="background must have shape"):
        composite(sigma, rgb, deltas, offsets, background=torch.ones(2, 3, device=DEV))
    with pytest.raises(InputError, match="background must have shape"):
        composite(sigma, rgb, deltas, offsets, background=(1.0, 1.0))
    with pytest.raises(InputError, match="background must be None, three numbers"):
        composite(sigma, rgb, deltas, offsets, background=("white", 1.0, 1.0))
    with pytest.raises(InputError, match="t must have shape"):
        composite(sigma, rgb, deltas, offsets, t=t[:3])
    with pytest.raises(InputError, match="rgb must have shape"):
        composite_dense(sigma[None], rgb, deltas[None])


@pytest.mark.parametrize("static", [True, False])
def test_positions_lists_a_masks_true_entries_to_a_given_size(static, monkeypatch):
    """`sampling.positions`: the True entries' flat positions in order, cut after `size` or padded with the fill
    value; the same through `torch.nonzero` where torch has no `nonzero_static`."""
    from tinn.render.sampling import positions
    if not static:
        monkeypatch.delattr(torch, "nonzero_static")
    mask = torch.tensor([[False, True, True], [False, False, True]])
    assert positions(mask, 3).tolist() == [1, 2, 5]
    assert positions(mask, 2).tolist() == [1, 2]
    assert positions(mask, 5).tolist() == [1, 2, 5, -1, -1]
    assert positions(mask, 4, fill_value=7).tolist() == [1, 2, 5, 7]
    assert positions(mask, 0).numel() == 0 and positions(mask, 3).dtype == torch.int64

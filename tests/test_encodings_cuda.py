"""The encoding kernels on the CUDA backend against the float64 CPU references of the other encoding tests.

Skipped unless tinn runs on CUDA:  TINN_ARCH=cuda python -m pytest tests/test_encodings_cuda.py
"""
import pytest
import torch

import tinn
from test_encodings import ref_frequency, ref_oneblob, ref_sh, ref_triangle_wave
from test_encodings_grid import CONFIGS, IDS, assert_close, inputs, make, ref_grid
from tinn.encodings import create_encoding

pytestmark = pytest.mark.skipif(tinn.runtime.arch() != "cuda", reason="CUDA backend only (TINN_ARCH=cuda)")


def eikonal(y, x, head):
    g, = torch.autograd.grad((y.to(head.dtype) @ head).sin().sum(), x, create_graph=True)
    return (g.norm(dim=1) - 1).square().sum() + (g * 0.3).sum()


@pytest.mark.parametrize("n_dims,kw,n_networks", CONFIGS, ids=IDS)
def test_grid_first_and_second_order_on_cuda(n_dims, kw, n_networks):
    enc = make(n_dims, n_networks, **kw)
    assert enc.params.is_cuda
    x, ids = (t.cpu() for t in inputs(enc, 512))  # the reference runs on the host
    head = torch.randn(enc.n_output_dims, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    xd = x.cuda().requires_grad_(True)
    hd = head.float().cuda().requires_grad_(True)
    xr = x.double().requires_grad_(True)
    pr = enc.params.detach().cpu().double().requires_grad_(True)
    hr = head.clone().requires_grad_(True)

    y, yr = enc(xd, ids.cuda()), ref_grid(enc, xr, pr, ids)
    assert_close(y.cpu(), yr, what="forward")
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    (y * w.cuda()).sum().backward()
    (yr * w.double()).sum().backward()
    assert_close(enc.params.grad.cpu(), pr.grad, rtol=1e-4, atol_frac=1e-5, what="d/dparams")
    if kw.get("interpolation") != "Nearest":
        assert_close(xd.grad.cpu(), xr.grad, rtol=1e-4, atol_frac=1e-4, what="d/dx")

        for t in (xd, xr, pr):
            t.grad = None
        enc.params.grad = None
        eikonal(enc(xd, ids.cuda()), xd, hd).backward()
        eikonal(ref_grid(enc, xr, pr, ids), xr, hr).backward()
        assert_close(enc.params.grad.cpu(), pr.grad, rtol=1e-4, atol_frac=1e-4, what="d2/dparams")
        assert_close(hd.grad.cpu(), hr.grad, rtol=1e-4, atol_frac=1e-4, what="d2/dhead")
        assert_close(xd.grad.cpu(), xr.grad, rtol=1e-3, atol_frac=1e-4, what="d2/dx")


@pytest.mark.parametrize("n_networks", [64, 1], ids=["global-atomics", "shared-memory-levels"])
def test_grid_atomics_under_heavy_contention_on_cuda(n_networks):
    """65k samples into coarse levels (27 and 125 vertices): every entry takes thousands of adds. One grid
    takes the shared-memory pre-reduction, 64 grids the global atomics."""
    enc = make(3, n_networks, n_levels=2, n_features_per_level=4, base_resolution=3, per_level_scale=1.7,
               grid_type="Dense")
    assert enc._shared_levels == 2  # both levels fit in a block's shared memory
    x, ids = (t.cpu() for t in inputs(enc, 1 << 16, seed=9))
    y = enc(x.cuda(), ids.cuda())
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(4))
    (y * w.cuda()).sum().backward()
    pr = enc.params.detach().cpu().double().requires_grad_(True)
    (ref_grid(enc, x.double(), pr, ids) * w.double()).sum().backward()
    assert_close(enc.params.grad.cpu(), pr.grad, rtol=1e-4, atol_frac=1e-5, what="contended d/dparams")
    assert pr.grad.abs().max() > 10


@pytest.mark.parametrize("n_dims,cfg,ref", [
    (3, {"otype": "Frequency", "n_frequencies": 4}, lambda x: ref_frequency(x, 4)),
    (3, {"otype": "TriangleWave", "n_frequencies": 6}, lambda x: ref_triangle_wave(x, 6)),
    (2, {"otype": "OneBlob", "n_bins": 16}, lambda x: ref_oneblob(x, 16)),
    (3, {"otype": "SphericalHarmonics", "degree": 8}, lambda x: ref_sh(x, 8)),
    (5, {"otype": "Composite", "nested": [{"otype": "SphericalHarmonics", "degree": 4, "n_dims_to_encode": 3},
                                         {"otype": "OneBlob", "n_bins": 8}]},
     lambda x: torch.cat([ref_sh(x[:, :3], 4), ref_oneblob(x[:, 3:], 8)], dim=1)),
], ids=["Frequency", "TriangleWave", "OneBlob", "SphericalHarmonics", "Composite"])
def test_parameter_free_encodings_on_cuda(n_dims, cfg, ref):
    enc = create_encoding(n_dims, cfg)
    x = torch.rand(256, n_dims, generator=torch.Generator().manual_seed(0))
    head = torch.randn(enc.n_output_dims, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.3
    xd, hd = x.cuda().requires_grad_(True), head.float().cuda().requires_grad_(True)
    xr, hr = x.double().requires_grad_(True), head.clone().requires_grad_(True)
    assert_close(enc(xd).cpu(), ref(xr), rtol=1e-4, atol_frac=1e-5, what="forward")
    eikonal(enc(xd), xd, hd).backward()
    eikonal(ref(xr), xr, hr).backward()
    assert_close(hd.grad.cpu(), hr.grad, rtol=1e-3, atol_frac=1e-4, what="d2/dhead")
    assert_close(xd.grad.cpu(), xr.grad, rtol=1e-3, atol_frac=1e-4, what="d2/dx")

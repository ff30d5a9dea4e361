"""tcnn's module surface: dtypes, devices, tracing, the Module attributes."""
import pytest
import torch

import tinn
import tinn.torch as tcnn

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def dev():
    return tinn.runtime.device()


def test_tcnn_input_handling():
    model = tcnn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
    x = torch.rand(20, 2, device=dev())
    y = model(x)
    for dtype in (torch.float64, torch.float16, torch.bfloat16):  # any float dtype, cast as tcnn does
        assert torch.allclose(model(x.to(dtype)), y, atol=1e-2)
    assert model(x.double()).dtype == torch.float32  # tcnn's output is its module dtype
    # tinn's own classes stay strict
    with pytest.raises(tinn.InputError, match="dtype torch.float64"):
        tinn.NetworkArray(2, 3, NET)(x.double())
    with pytest.raises(tinn.TinnError, match="cannot be traced"):
        torch.jit.trace(model, x)
    with pytest.raises(tinn.InputError, match="float32 parameters"):
        model.double()(x)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving CPU inputs needs a CUDA runtime")
def test_cpu_inputs_move_to_the_gpu_with_a_warning():
    if tinn.runtime.arch() != "cuda":
        pytest.skip("tinn runs on the CPU here")
    model = tcnn.Network(2, 3, NET)
    with pytest.warns(UserWarning, match="moved from the CPU"):
        y = model(torch.rand(10, 2))
    assert y.is_cuda


def test_module_surface():
    enc = tcnn.Encoding(2, {"otype": "Frequency", "n_frequencies": 2}, dtype=torch.float16)
    assert isinstance(enc, tcnn.Module) and isinstance(enc, tcnn.Encoding) and enc.dtype == torch.float16
    assert enc(torch.rand(5, 2, device=dev())).dtype == torch.float16  # tcnn's output dtype; float32 inside
    model = tcnn.NetworkWithInputEncoding(2, 3, {"otype": "Frequency", "n_frequencies": 2}, NET)
    assert model.jit_fusion is False and tcnn.supports_jit_fusion() is False
    model.jit_fusion = tcnn.supports_jit_fusion()  # what tcnn's sample does
    assert tcnn.free_temporary_memory() is None
    assert model.loss_scale == 1.0 and model.n_params() == model.params.numel()

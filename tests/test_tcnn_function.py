"""tcnn's function through `import tinn.torch as tcnn`: inputs padded as tcnn pads them."""
import pytest
import torch

import tinn
import tinn.torch as tcnn

NET = {"otype": "FullyFusedMLP", "n_neurons": 16, "n_hidden_layers": 1, "activation": "ReLU",
       "output_activation": "None"}


def dev():
    return tinn.runtime.device()


@pytest.mark.parametrize("encoding,n_in,features,pad,value", [
    ({"otype": "Identity"}, 3, 3, 13, 1.0),                                  # 3 -> 16 with ones (a bias)
    ({"otype": "Frequency", "n_frequencies": 12}, 2, 48, 0, 1.0),           # already a multiple of 16
    ({"otype": "OneBlob", "n_bins": 4}, 3, 12, 4, 1.0),
    ({"otype": "HashGrid", "n_levels": 3, "n_features_per_level": 4, "log2_hashmap_size": 8}, 2, 12, 4, 0.0),
    ({"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 8}, 3, 32, 0, 0.0),
    ({"otype": "Composite", "nested": [{"otype": "Identity", "n_dims_to_encode": 1},
                                       {"otype": "HashGrid", "n_levels": 5, "n_features_per_level": 2,
                                        "log2_hashmap_size": 8}]}, 3, 11, 5, 0.0),   # the last nested pads
])
def test_encoding_output_is_padded_as_tcnn_pads_it(encoding, n_in, features, pad, value):
    model = tcnn.NetworkWithInputEncoding(n_in, 2, encoding, NET)
    assert model.encoding.n_output_dims == features
    assert model.network.input_padding == (pad, value)
    assert model.network.layer_shapes()[0] == (16, features + pad)


def test_a_network_fits_an_affine_function_through_its_bias_column():
    """tcnn.Network(1, 1) has a ones column: y = x + 1 is in reach (f(0) = 1), which an MLP without
    biases and without padding cannot represent."""
    torch.manual_seed(0)
    net = tcnn.Network(1, 1, NET)
    assert net.input_padding == (15, 1.0)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(600):
        x = torch.rand(256, 1, device=dev()) * 2 - 1
        loss = ((net(x) - (x + 1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss) < 1e-3
    assert abs(float(net(torch.zeros(1, 1, device=dev()))) - 1.0) < 0.05




@pytest.mark.parametrize("n_networks", [1, 4])  # one network: vendor GEMM gradients; an array: tile partials
@pytest.mark.parametrize("output_activation", ["None", "Exponential"])
def test_padded_output_rows_are_kept_but_never_computed(n_networks, output_activation):
    """tcnn pads 3 outputs to 16 rows of the last matrix. tinn keeps the rows (layout, export) but computes
    only the 3 real outputs: outputs and gradients match the float64 reference of the whole padded network,
    and the padded rows' gradient is exactly zero, even where they would overflow (Exponential of large
    weights)."""
    import reference

    cfg = {**NET, "n_neurons": 32, "output_activation": output_activation}
    net = tcnn.NetworkArray(5, 3, cfg, n_networks=n_networks, seed=4) if n_networks > 1 else \
        tcnn.Network(5, 3, cfg, seed=4)
    assert net.layer_shapes()[-1] == (16, 32) and net.shape.n_out == 3
    with torch.no_grad():  # padded rows large enough that computing them would give inf
        net.weights(1)[:, 3:] = 500.0
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(300, 5, generator=gen).to(dev())
    ids = torch.randint(0, n_networks, (300,), generator=gen, dtype=torch.int32).to(dev())
    dy = torch.randn(300, 3, generator=gen).to(dev())
    args = (x, ids) if n_networks > 1 else (x,)
    y = net(*args)
    y.backward(dy)
    # The real outputs do not depend on the padded rows: the reference runs with them zeroed (computing
    # exp(500 * ...) and dropping it would give 0 * inf = NaN gradients, which tinn must not produce).
    p = net.params.detach().double().clone()
    net.weights(1, p)[:, 3:] = 0.0
    p.requires_grad_(True)
    y_ref = reference.mlp_array(net, p, x.double(), ids, "ReLU", output_activation)
    y_ref.backward(dy.double())
    assert y.shape == (300, 3) and torch.isfinite(y).all()
    assert reference.rel_err(y, y_ref) < 1e-5
    g, g_ref = net.params.grad, p.grad
    assert reference.rel_err(g, g_ref) < 1e-5
    padded = net.weights(1, g)[:, 3:]
    assert torch.count_nonzero(padded) == 0 and padded.numel() == n_networks * 13 * 32
    assert torch.count_nonzero(net.weights(1, g)[:, :3]) > 0

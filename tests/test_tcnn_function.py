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



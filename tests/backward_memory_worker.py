"""One process's first backwards through autograd, for tests/test_big_arrays.py's gradient-buffer tests.

    python tests/backward_memory_worker.py N_NETWORKS

Builds a NetworkArray of N_NETWORKS rows, runs two forward/backward passes through torch autograd and prints
one JSON line: the table's bytes, the process's peak resident memory (ru_maxrss), and per backward whether
`params.grad` is the very tensor tinn's backward returned (autograd adopted it) or a copy. A fresh process,
because the first backward of a kernel instance in a process is what differs.
"""
from __future__ import annotations

import json
import os
import resource
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the tests' shared helpers (reference.py)

import torch  # noqa: E402

NETWORK = {"otype": "CutlassMLP", "n_neurons": 64, "n_hidden_layers": 2, "activation": "ReLU",
           "output_activation": "None"}


def main(n_networks: int) -> dict:
    import tinn
    from tinn.networks import NetworkArray
    from reference import record_gradient_pointers

    tinn.init("cpu")
    net = NetworkArray(4, 4, NETWORK, n_networks=n_networks, kernels="unfused")
    returned = record_gradient_pointers(net)
    gen = torch.Generator().manual_seed(0)
    adopted = []
    for step in range(2):
        x = torch.rand(256, 4, generator=gen)
        ids = torch.randint(0, n_networks, (256,), generator=gen, dtype=torch.int32)
        net.params.grad = None
        net(x, ids).square().sum().backward()
        adopted.append(net.params.grad.data_ptr() == returned[-1])
    return {"table_bytes": net.params.numel() * 4, "n_params": net.params.numel(),
            "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "adopted": adopted}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))

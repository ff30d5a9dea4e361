"""What Taichi's reverse mode costs against tinn's hand-written backward passes, for the same functions.

    python -m benchmarks.bench_autodiff [--log2-samples 20] [--json out.json]

Cases (forward + backward of one batch, the gradients a training step needs):
- Frequency encoding (3 inputs, 6 octaves, sin and cos: 36 outputs): input gradient only; tinn's
  hand-written `Frequency` against the same function as a `tinn.autodiff.AutodiffPart`.
- The same Frequency encoding, second order (an eikonal-style loss on its input gradient): the
  hand-written `backward_backward` against the autodiff part's tangent function under reverse mode.
- One linear layer per network (32 in, 16 out; 64 networks and 1 network): parameter and input gradients;
  tinn's `NetworkArray` without hidden layers against an autodiff part computing y = W x per sample, with
  1 and 4 gradient replicas and the automatic count (`tinn.autodiff.replicas_for`).
- The L2 loss (value and gradient, 3 outputs): tinn's loss kernel against `tinn.autodiff.builtin_loss("L2")`.
Prints a table and writes JSON: milliseconds and peak memory per path, and their ratio.
"""
import argparse


import torch  # noqa: E402

import tinn  # noqa: E402
from tinn.backend import ti  # noqa: E402

OCTAVES = 6
N_IN, N_OUT = 32, 16


@ti.func
def linear(x: ti.template(), p: ti.template(), b, net, y: ti.template()):
    for o in ti.static(range(N_OUT)):
        acc = 0.0
        for i in ti.static(range(N_IN)):
            acc += p[net, o * N_IN + i] * x[b, i]
        y[b, o] = acc


def main(argv=None):
    from benchmarks.common import peak_memory_mib, peak_memory_reset, print_table, time_fn, write_json
    from tinn.autodiff import AutodiffPart, builtin_loss, frequency_encoding, replicas_for
    from tinn.encodings import create_encoding
    from tinn.networks import NetworkArray

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log2-samples", type=int, default=None, help="default: 20 on a GPU, 15 on the CPU")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    arch = tinn.init(args.arch)
    dev = tinn.runtime.device()
    batch = 1 << (args.log2_samples or (20 if arch == "cuda" else 15))

    def measure(part, n_in, n_out, n_networks, need_params):
        x = torch.rand(batch, n_in, device=dev)
        ids = torch.randint(0, n_networks, (batch,), device=dev, dtype=torch.int32)
        dy = torch.randn(batch, n_out, device=dev)

        def step():
            y, ctx = part.forward_with_context(x, ids, train=True)
            return part.backward(ctx, dy, need_dx=True, need_grads=need_params)
        step()
        peak_memory_reset()
        ms = 1e3 * time_fn(step, reps=args.reps)
        return ms, peak_memory_mib()

    def measure_second_order(part):
        x = torch.rand(batch, 3, device=dev, requires_grad=True)
        w = torch.randn(batch, part.n_output_dims, device=dev)

        def step():
            gx, = torch.autograd.grad((part(x) * w).sum(), x, create_graph=True)
            return torch.autograd.grad(gx.square().sum(), x)
        step()
        peak_memory_reset()
        ms = 1e3 * time_fn(step, reps=args.reps)
        return ms, peak_memory_mib()

    def row(case, hand, auto):
        return {"case": case, "hand_ms": hand[0], "auto_ms": auto[0], "ratio": auto[0] / hand[0],
                "hand_mib": hand[1], "auto_mib": auto[1]}

    rows = []
    freq = create_encoding(3, {"otype": "Frequency", "n_frequencies": OCTAVES})
    auto_freq = frequency_encoding(3, OCTAVES)
    rows.append(row("Frequency, 3 in x 6 octaves (dx)", measure(freq, 3, 6 * OCTAVES, 1, False),
                    measure(auto_freq, 3, 6 * OCTAVES, 1, False)))
    rows.append(row("Frequency, second order (eikonal-style)", measure_second_order(freq),
                    measure_second_order(auto_freq)))
    for n_networks in (64, 1):
        net = NetworkArray(N_IN, N_OUT, {"otype": "CutlassMLP", "n_neurons": 16, "n_hidden_layers": 0,
                                         "output_activation": "None"}, n_networks=n_networks)
        hand = measure(net, N_IN, N_OUT, n_networks, True)
        auto_r = replicas_for(batch, n_networks, N_IN * N_OUT, arch)
        for replicas in (1, 4, None):
            auto_lin = AutodiffPart(linear, N_IN, N_OUT, N_IN * N_OUT, n_networks=n_networks,
                                    gradient_replicas=replicas)
            label = f"auto = {auto_r}" if replicas is None else str(replicas)
            rows.append(row(f"linear 32 -> 16, {n_networks} network(s), replicas {label}", hand,
                            measure(auto_lin, N_IN, N_OUT, n_networks, True)))
    pred, target = torch.rand(batch, 3, device=dev), torch.rand(batch, 3, device=dev)
    timed = []
    for loss in (tinn.create_loss({"otype": "L2"}), builtin_loss("L2")):
        loss.evaluate(pred, target)
        peak_memory_reset()
        timed.append((1e3 * time_fn(lambda: loss.evaluate(pred, target), reps=args.reps), peak_memory_mib()))
    rows.append(row("L2 loss, 3 outputs (value + gradient)", *timed))
    device = torch.cuda.get_device_name(0) if arch == "cuda" else "cpu"
    print(f"\nautodiff against hand-written backward, {batch} samples, {device}")
    print_table(rows, [("case", "case", "s"), ("hand_ms", "hand-written ms", ".2f"), ("auto_ms", "autodiff ms", ".2f"),
                       ("ratio", "autodiff / hand", ".2f"), ("hand_mib", "hand MiB", ".0f"),
                       ("auto_mib", "autodiff MiB", ".0f")])
    write_json(args.json, {"device": device, "batch": batch, "rows": rows})
    return rows


if __name__ == "__main__":
    main()

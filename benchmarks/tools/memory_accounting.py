"""Where a fused MLP-array training step's memory goes, buffer by buffer, at its peak.

    python -m benchmarks.tools.memory_accounting            # the 4096 x 64 target case, 2^22 samples
    python -m benchmarks.tools.memory_accounting --networks 64 --width 128 --log2-samples 20

Counted from the code (tinn/networks/array.py, tinn/losses.py, tinn/trainer.py, tinn/optimizers/adam.py):
the peak of `Trainer.training_step` is inside the backward, while the deltas, the forward's
activations, the loss gradient and the fresh parameter gradient are alive together. The `elements`
buffer of the loss and the routing's sort temporaries are freed before that point. `--before` gives
the accounting of the deltas layout before the output layer got a buffer of its own.
"""
from __future__ import annotations

import argparse

MIB = float(1 << 20)


def accounting(networks: int, width: int, n_in: int, n_out: int, hidden: int, batch: int,
               before: bool = False) -> list[tuple[str, int]]:
    """(buffer, bytes) live at the peak of a fused training step with Adam, float32."""
    layers = hidden + 1
    params = networks * (n_in * width + (layers - 2) * width * width + width * n_out) if hidden else \
        networks * n_in * n_out
    deltas_rows = layers * max(width, n_out) if before else hidden * width + n_out
    return [
        ("inputs x (batch, n_in)", 4 * batch * n_in),
        ("targets (batch, n_out)", 4 * batch * n_out),
        ("net ids + sorted order (int32)", 8 * batch),
        ("parameters", 4 * params),
        ("parameter gradient", 4 * params),
        ("Adam m, v (float32) and steps (int32)", 12 * params),
        (f"activations ({hidden}, {width}, batch)", 4 * hidden * width * batch),
        ("output (batch, n_out)", 4 * batch * n_out),
        ("loss gradient dy (batch, n_out)", 4 * batch * n_out),
        ("deltas " + (f"({layers}, {max(width, n_out)}, batch)" if before
                      else f"({hidden}, {width}, batch) + output ({n_out}, batch)"), 4 * deltas_rows * batch),
    ]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--networks", type=int, default=4096)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--n-input", type=int, default=32)
    p.add_argument("--n-output", type=int, default=16)
    p.add_argument("--hidden-layers", type=int, default=2)
    p.add_argument("--log2-samples", type=int, default=22)
    args = p.parse_args(argv)
    shape = (args.networks, args.width, args.n_input, args.n_output, args.hidden_layers, 1 << args.log2_samples)
    before, after = accounting(*shape, before=True), accounting(*shape)
    print(f"{'buffer':55} {'before MiB':>11} {'after MiB':>10}")
    for (name_b, b), (name_a, a) in zip(before, after):
        print(f"{name_a:55} {b / MIB:>11.0f} {a / MIB:>10.0f}")
    print(f"{'total at the peak':55} {sum(b for _, b in before) / MIB:>11.0f} {sum(a for _, a in after) / MIB:>10.0f}")


if __name__ == "__main__":
    main()

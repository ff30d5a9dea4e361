"""tcnn's image step (config_hash, one network, the tensor cores, steps replayed from CUDA graphs) under changes of
the kernels' module constants, side by side in one process: the table gradient's corner pairs
(`grid_triton.PAIRED_CORNERS`) and private copies (`PRIVATE_COPIES`), and the backward's chunk for one network
(`tensor_cores.chunk_size`). Each variant builds its trainer with its constants in force and captures its step
then (a replay keeps what the capture saw); the variants are then timed in turn, three rounds, each the median of
three blocks of 100 steps. Last, the step's kernels issued op by op with the defaults (torch.profiler).

    python -m benchmarks.tools.image_step_constants [--precisions float16,bfloat16] [--log2-batch 18] [--json F]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "..", "..", "tinn", "configs", "config_hash.json")

VARIANTS = [("defaults", {}), ("no corner pairs", {"pairs": False}), ("32 private copies", {"copies": 32}),
            ("128 private copies", {"copies": 128}), ("no pairs, 32 copies", {"pairs": False, "copies": 32}),
            ("chunks of 512", {"chunk": 512}), ("chunks of 2048", {"chunk": 2048})]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precisions", default="float16,bfloat16")
    p.add_argument("--log2-batch", type=int, default=18)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import torch

    import tinn
    if tinn.init() != "cuda":
        sys.exit("image_step_constants needs CUDA")
    from benchmarks.bench_torch_path import ImageSteps
    from benchmarks.common import cuda_kernels, pipelined_ms, print_table, settings_installed, sync, write_json
    from tinn.kernels import grid_triton
    from tinn.networks import tensor_cores as path

    config = tinn.load_config(CONFIG)
    defaults = (grid_triton.PAIRED_CORNERS, grid_triton.PRIVATE_COPIES, path.chunk_size)

    def constants(change: dict) -> None:
        grid_triton.PAIRED_CORNERS = change.get("pairs", defaults[0])
        grid_triton.PRIVATE_COPIES = change.get("copies", defaults[1])
        chunk = change.get("chunk")
        path.chunk_size = defaults[2] if chunk is None else (lambda batch, tile, *_: max(tile, chunk // tile * tile))

    base = tinn.settings.installed()
    built = []
    for precision in args.precisions.split(","):
        chosen = base.replace(**tinn.settings.parse(f"precision={precision}"))
        for name, change in VARIANTS:
            constants(change)
            with settings_installed(chosen):
                steps = ImageSteps(config, args.log2_batch)
                for _ in range(6):  # compiled, and captured at the second step
                    steps.native()
                sync()
            built.append((precision, name, chosen, steps))
    constants({})
    times = {(precision, name): [] for precision, name, _, _ in built}
    with tinn.checks.disabled():
        for _ in range(3):
            for precision, name, chosen, steps in built:
                with settings_installed(chosen):
                    times[(precision, name)].append(pipelined_ms(steps.native, 100, 3))
    rows = [{"precision": precision, "variant": name, "ms": statistics.median(times[(precision, name)]),
             "rounds": times[(precision, name)], "graphs": steps.trainer.step_graph_status}
            for precision, name, _, steps in built]
    print(torch.cuda.get_device_name())
    print_table(rows, [("precision", "precision", "s"), ("variant", "variant", "s"), ("ms", "step ms", ".3f"),
                       ("graphs", "step graphs", "s")])
    op_by_op = base.replace(**tinn.settings.parse(
        f"precision={args.precisions.split(',')[0]},step_graphs=false,dense_single_network=false"))
    with settings_installed(op_by_op):
        steps = ImageSteps(config, args.log2_batch)
        for _ in range(5):
            steps.native()
        sync()
        with tinn.checks.disabled():
            kernels = cuda_kernels(steps.native, 20)
    print(f"\nkernels of one step issued op by op ({steps.trainer.model.network.path}), "
          f"total {sum(k['ms'] for k in kernels):.3f} ms")
    for k in kernels[:12]:
        print(f"  {k['ms']:.4f} ms  {k['calls']:.0f}x  {k['kernel']}")
    write_json(args.json, {"device": torch.cuda.get_device_name(), "rows": rows, "op_by_op_kernels": kernels})
    return rows


if __name__ == "__main__":
    main()

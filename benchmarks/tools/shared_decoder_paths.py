"""What a decoder shared by an octree's nodes costs on each MLP path, beside a decoder per node: the node array of
the scale preset (a hash grid per node, the octree field's default MLP), its samples in runs of one node as a
renderer sends them. Times inference and a training step (forward, backward of a mean squared error) per variant:

    per_node        an MLP per node (the array's default: the tensor cores in float16 on CUDA)
    shared          one MLP for every node, the default rule (`served_ids`: as the array would compute)
    shared_float32  one MLP, float32 (Taichi's fused kernels on CUDA)
    shared_dense    one MLP, float16 as cuBLAS GEMMs (tuning.dense_single_network)

    python -m benchmarks.tools.shared_decoder_paths --nodes 37,692 --samples 4194304 --json out/shared_decoder.json
"""
from __future__ import annotations

import argparse

import torch

import tinn
from benchmarks import common

# The levels and table size of the scale preset's node grids at depth 4 (demos/octree_lod.py --scale: 10 levels of
# 2^11 entries per node).
ENCODING = {"otype": "HashGrid", "n_levels": 10, "n_features_per_level": 2, "log2_hashmap_size": 11,
            "base_resolution": 2, "per_level_scale": 1.5}
VARIANTS = ("per_node", "shared", "shared_float32", "shared_dense")


def build(variant: str, n_nodes: int):
    from tinn.models import NetworkWithInputEncoding
    from tinn.scenes.fields.octree_field import DEFAULT_NETWORK

    precision = {"shared_float32": "float32", "shared_dense": "float16"}.get(variant)
    return NetworkWithInputEncoding(3, 4, ENCODING, DEFAULT_NETWORK, n_networks=n_nodes, seed=3,
                                    group_by_network=False, share_network=variant != "per_node",
                                    precision=precision)


def batch(n_nodes: int, n: int, device):
    """Points in [0, 1)^3 and their node ids in runs of one node, the runs' lengths random (a frame's rays)."""
    g = torch.Generator(device="cpu").manual_seed(5)
    ids = torch.sort(torch.randint(0, n_nodes, (n,), generator=g)).values.to(torch.int32)
    return torch.rand(n, 3, generator=g).to(device), ids.to(device)


def measure(variant: str, n_nodes: int, n: int, reps: int) -> dict:
    device = tinn.runtime.device()
    chosen = tinn.settings.installed()
    if variant == "shared_dense":
        chosen = chosen.replace(dense_single_network=True)
    with common.settings_installed(chosen):
        model = build(variant, n_nodes)
    x, ids = batch(n_nodes, n, device)
    target = torch.rand(n, 4, device=device)

    def infer():
        with torch.no_grad():
            model(x, ids)

    def step():
        loss = torch.nn.functional.mse_loss(model(x, ids).float(), target)
        loss.backward()

    timer = common.gpu_ms if device.type == "cuda" else (lambda fn, reps: 1e3 * common.time_fn(fn, reps=reps))
    return {"variant": variant, "nodes": n_nodes, "samples": n, "path": model.network.path,
            "precision": model.network.precision, "inference_ms": timer(infer, reps=reps),
            "step_ms": timer(step, reps=reps)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default=None, help="cuda or cpu (default: cuda where present)")
    p.add_argument("--nodes", default="37,692", help="comma list of node counts")
    p.add_argument("--samples", type=int, default=1 << 22)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    tinn.init(args.arch)
    rows = [measure(v, int(n), args.samples, args.reps)
            for n in args.nodes.split(",") for v in args.variants.split(",")]
    common.print_table(rows, [("nodes", "nodes", "d"), ("variant", "decoder", "s"), ("path", "path", "s"),
                              ("precision", "precision", "s"), ("inference_ms", "inference ms", ".3f"),
                              ("step_ms", "training step ms", ".3f")])
    common.write_json(args.json, {"arch": tinn.runtime.arch(), "rows": rows})


if __name__ == "__main__":
    main()

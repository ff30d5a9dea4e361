"""How much of a mesh's surface an octree over its views' visual hull leaves in pruned space (where it renders as
background), for hull voxel resolutions, dilations and depths, against `hull_octree`'s own choice; and how
unevenly the surface spreads over the deepest nodes (the largest and smallest share, an even share, and the
share of the busiest quarter of them), each of which holds a table of one fixed size.

The mesh is rendered into --views views at --res, the hull sampled at each voxel resolution (voxel centres,
`foreground_points`), the tree built over it (`Octree.build`, min 8 points a split), and points spread over the
mesh's triangles by area looked up at the tree's depth: the share that lands in no node is printed.

    python -m benchmarks.tools.octree_hull_coverage --meshes bunny,duck,wuson --res 200 --views 100
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

import tinn

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--meshes", default="bunny,duck,wuson", help="names (bunny, duck, wuson) or paths, comma list")
    p.add_argument("--res", type=int, default=200)
    p.add_argument("--views", type=int, default=100)
    p.add_argument("--depths", default="2,3")
    p.add_argument("--hull-resolutions", default="32,64,128,256")
    p.add_argument("--dilations", default="0,1")
    p.add_argument("--points", type=int, default=1_000_000, help="surface points per mesh")
    p.add_argument("--arch", default=None)
    args = p.parse_args(argv)
    tinn.init(args.arch)
    from benchmarks.tools.octree_quality import MESHES
    from tinn.scenes.acceleration.octree import Octree
    from tinn.scenes.data.formats import load_scene
    from tinn.scenes.data.mesh import read_mesh, scene_from_mesh
    from tinn.scenes.training.octree_training import foreground_points, hull_octree

    dev = tinn.runtime.device()
    print(f"{'mesh':>10s} {'depth':>5s} {'hull':>9s} {'dilate':>6s} | {'nodes per depth':<22s} {'surface pruned':>14s} | "
          f"surface share of the deepest nodes: {'most':>6s} {'least':>6s} {'even':>6s} {'top 1/4':>7s}")
    for name in args.meshes.split(","):
        path = MESHES.get(name, name)
        with tempfile.TemporaryDirectory() as tmp:
            train = load_scene(scene_from_mesh(path, os.path.join(tmp, "scene"), args.views, 0, args.res),
                               "train").to(dev)
        surface = read_mesh(path).normalised().surface_points(args.points).to(dev)
        label = os.path.splitext(os.path.basename(path))[0]

        def row(depth, hull, dilate, tree):
            ids = tree.lookup(surface, depth)
            lost = float((ids < 0).float().mean())
            # How unevenly the surface spreads over the deepest nodes (each holds one fixed-size table).
            counts = torch.bincount(ids[ids >= 0].long(), minlength=tree.n_nodes)[tree.depth == tree.deepest]
            share = (counts.double() / max(1, int(counts.sum()))).sort(descending=True).values
            quarter = float(share[:max(1, share.numel() // 4)].sum())
            print(f"{label:>10s} {depth:5d} {hull:>9s} {dilate:>6s} | {str(tree.nodes_per_level()):<22s} "
                  f"{100 * lost:13.3f}% | {100 * float(share[0]):6.1f}% {100 * float(share[-1]):6.2f}% "
                  f"{100 / share.numel():6.1f}% {100 * quarter:7.0f}%", flush=True)

        for depth in (int(d) for d in args.depths.split(",")):
            for resolution in (int(r) for r in args.hull_resolutions.split(",")):
                for dilate in (int(d) for d in args.dilations.split(",")):
                    points = foreground_points(train, resolution=resolution, dilate=dilate)
                    tree = Octree.build(points.float(), train.box_min.to(dev), train.box_max.to(dev), depth, 8)
                    row(depth, str(resolution), str(dilate), tree)
            row(depth, "hull_octree", "1", hull_octree(train, depth, min_points=8))


if __name__ == "__main__":
    main()

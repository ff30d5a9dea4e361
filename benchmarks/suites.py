"""The registry of benchmark suites that `python -m benchmarks run SUITE` runs.

A suite names the module that measures (its own command line keeps working: `python -m benchmarks.bench_grid`)
and says how the harness's common options become that module's arguments. Modules are imported only when their
suite runs, so a suite whose module is not in this checkout is listed and refused by name, never an import error.

Adding a suite: write a module under `benchmarks/` or `benchmarks/tools/` with `main(argv)` that accepts
`--json PATH` (where to write its results), `--quick` (toy sizes, seconds on a CPU) and `--arch {cpu,cuda}`,
prints a table and returns its results; then register it below with `standard_argv`. `tcnn` and
`octree_quality` are registered this way ahead of their modules.
"""
from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Options:
    """The harness's common options, as every suite sees them."""
    quick: bool = False
    arch: str | None = None      # None: the module's own choice (TINN_ARCH, else a GPU if present)
    json_path: str = ""          # where the suite's JSON goes
    out_dir: str = ""            # the suite's folder under out/benchmarks/
    gpus: int | None = None      # processes of a multi-GPU suite (default: every visible GPU)
    extra: tuple[str, ...] = ()  # the module's own options, passed through after `--`


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    module: str                              # imported as benchmarks.<...>
    summary: str                             # one line for `python -m benchmarks list`
    argv: Callable[[Options], list[str]]     # the module's command line for these options
    needs: str = "any"                       # "any", "cuda" (one GPU), "multi-gpu" (two or more, NCCL)
    launch: str = "call"                     # "call": module.main(argv) here; "torchrun": one process per GPU
    table: Callable[[dict], None] | None = None  # prints the table where the module prints none of its own


def standard_argv(o: Options) -> list[str]:
    """The command line of a module that follows the suite convention (--json, --quick, --arch)."""
    return ["--json", o.json_path] + (["--quick"] if o.quick else []) + (["--arch", o.arch] if o.arch else [])


def _arch(o: Options) -> list[str]:
    return ["--arch", o.arch] if o.arch else []


def _image(o: Options) -> list[str]:
    quick = ["--log2-batch", "10", "--steps", "2", "--reps", "1"] if o.quick else []
    return ["--json", o.json_path] + quick + _arch(o)


def _grid_kernels(o: Options) -> list[str]:
    quick = ["--rounds", "1", "--steps", "5"] if o.quick else []
    return ["--json", o.json_path] + quick


def _arrays(o: Options) -> list[str]:
    quick = ["--networks", "1,4", "--log2-samples", "8", "--reps", "1", "--no-vmap", "--no-grouped"] if o.quick else []
    return ["--json", o.json_path] + quick + _arch(o)


def _grid(o: Options) -> list[str]:
    quick = ["--batch", "256", "--iters", "1", "--grids", "1,4", "--n-levels", "2", "--log2-single", "8",
             "--log2-array", "6"] if o.quick else []
    return ["--json", o.json_path, "--device", o.arch or "auto"] + quick


def _scenes(o: Options) -> list[str]:
    return ["--json", o.json_path, "--out", o.out_dir] + (["--quick"] if o.quick else [])


def _startup(o: Options) -> list[str]:
    quick = ["--runs", "cold", "--steps", "1", "--batch", "256", "--size", "16", "--no-count-kernels"] if o.quick else []
    return ["--json", o.json_path] + quick + _arch(o)


def _sharded(o: Options) -> list[str]:
    return ["--out", o.json_path] + (["--tiny"] if o.quick else [])


def _tensor_cores(o: Options) -> list[str]:
    return ["--part", "bench", "--out", o.json_path] + (["--quick"] if o.quick else [])


def _web_viewer(o: Options) -> list[str]:
    return ["--json", o.json_path, "--task", "image,kilonerf,octree", "--out", o.out_dir] + \
        (["--quick"] if o.quick else []) + _arch(o)


def _scenes_table(r: dict) -> None:
    from benchmarks.common import print_table
    print_table([r], [("res", "res", ""), ("samples", "samples/ray", "d"), ("kilonerf_ms", "KiloNeRF ms", ".1f"),
                      ("octree_ms", "octree ms", ".1f"), ("octree_every_sample_ms", "octree, every sample ms", ".1f"),
                      ("octree_over_kilonerf_fps", "octree fps / KiloNeRF fps", ".2f"),
                      ("psnr_kilonerf", "PSNR KiloNeRF", ".2f"), ("psnr_octree", "PSNR octree", ".2f")])


SUITES = {s.name: s for s in [
    Suite("image", "benchmarks.bench_torch_path",
          "the image step (tcnn's learning-an-image sample): Trainer against the tinn.torch loop, per step", _image),
    Suite("arrays", "benchmarks.bench_mlp_array",
          "MLP arrays (N networks, samples routed by id): tinn against torch bmm (fp32, TF32, autocast fp16) / "
          "vmap / grouped GEMMs, and the fastest of them", _arrays),
    Suite("grid", "benchmarks.bench_grid",
          "hash-grid encoding throughput, one grid and an array of grids, against a torch hash grid", _grid),
    Suite("scenes", "benchmarks.octree_render",
          "scenes: trains KiloNeRF and the octree LoD demo, then times their frames (and PSNR)", _scenes,
          table=_scenes_table),
    Suite("sharded", "benchmarks.bench_sharded",
          "sharded arrays over GPUs (one process each, NCCL): strong and weak scaling, a field too big for one",
          _sharded, needs="multi-gpu", launch="torchrun"),
    Suite("startup", "benchmarks.bench_startup",
          "start-up of the image demo: seconds to each phase, cold and warm kernel cache (fresh processes)",
          _startup),
    Suite("tensor_cores", "benchmarks.tools.tensor_core_check",
          "tensor-core (Triton) MLP-array kernels against torch's GEMMs, each precision", _tensor_cores,
          needs="cuda"),
    Suite("grid_kernels", "benchmarks.tools.grid_kernels",
          "the grid's lookup and table gradient, Taichi's kernels against Triton launches, alternating in one "
          "process: per call and in tcnn's image step", _grid_kernels, needs="cuda"),
    Suite("web_viewer", "benchmarks.tools.web_viewer_cost",
          "what the web viewer costs training (image, KiloNeRF, octree): steps/s with no viewer, served, a client "
          "resting and moving", _web_viewer),
    Suite("tcnn", "benchmarks.tools.tcnn_native",
          "tiny-cuda-nn itself against tinn on the same models (needs the tcnn extension)", standard_argv),
    Suite("octree_quality", "benchmarks.tools.octree_quality",
          "octree LoD scenes: quality (PSNR) against size and training time", standard_argv),
]}

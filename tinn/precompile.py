"""Compile ahead of time the kernels that a config's training step and inference use.

    tinn-precompile --config config_hash.json --arch cuda                 # the image demo's kernels
    tinn-precompile --config my.json --inputs 3 --outputs 4 --networks 64 --no-image
    tinn-precompile --config my.json --cache-dir /opt/ticache              # a cache directory of its own

Taichi compiles each kernel instance (a kernel with its template arguments) at its first launch and keeps
the result in its offline cache on disk (`~/.cache/taichi/ticache`, or `ti.init(offline_cache_file_path=...)`
through `tinn.init(..., offline_cache_file_path=...)`, or `TI_OFFLINE_CACHE_FILE_PATH`). A later process with
the same Taichi, arch and settings loads them instead of compiling. This runs one training step and one
inference pass, the way `demos/mlp_learning_an_image.py` does (its image task by default), so that the
cache is full before the first real run: at install time, or in a Docker build on a machine with the GPU.

What is cached depends on the arch, the settings (`tinn.Settings`), the config and the model's shape
(input and output widths, number of networks): pre-compile with the ones the real run uses. The batch
size does not choose kernels, but by default the step uses the demo's batch all the same.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import torch

from . import backend, checks, runtime
from .config import load_config


@contextlib.contextmanager
def recording():
    """Yields a list that fills with "module.kernel" for each kernel instance built in the block (Taichi
    builds an instance's IR once per process, then compiles it or loads it from the offline cache). Empty
    where the backend's internals are not the expected ones."""
    built: list[str] = []
    impl = getattr(getattr(backend.load(), "lang", None), "kernel_impl", None)
    kernel = getattr(impl, "Kernel", None)
    original = getattr(kernel, "materialize", None)
    if original is None:
        yield built
        return

    def materialize(self, key=None, *args, **kwargs):
        cache = self.compiled_kernels if hasattr(self, "compiled_kernels") else getattr(self, "materialized_kernels", {})
        fresh = key is None or key not in cache
        before = len(cache)
        out = original(self, key, *args, **kwargs)
        if fresh and len(cache) > before:
            built.append(f"{self.func.__module__}.{self.func.__name__}")
        return out

    kernel.materialize = materialize
    try:
        yield built
    finally:
        kernel.materialize = original


def cache_dir() -> str | None:
    """The offline-cache directory of this process's Taichi (after tinn.init), None if unknown."""
    try:
        return backend.load().lang.impl.current_cfg().offline_cache_file_path
    except AttributeError:
        return None


def precompile(config: dict | str, n_input_dims: int = 2, n_output_dims: int = 3, *, n_networks: int = 1,
               batch: int | None = None, image: bool = True, seed: int = 1337) -> list[str]:
    """Run one training step and one inference pass of `config` (a dict or a JSON path) and return the
    kernel instances this process built for them, in order ("module.kernel", repeated per instance).

    `image=True` (2 inputs, 3 outputs, `n_networks` a square number of tiles) draws the batch and renders
    with the image task of demos/mlp_learning_an_image.py, so its sampling kernel is compiled too;
    otherwise the batch is uniform random inputs in [0, 1) and random targets. Initialises tinn with
    defaults if nobody did (call `tinn.init(arch, ...)` first to choose the arch, settings or cache).
    """
    from .tasks.image import ImageTask, default_image
    from .trainer import Trainer

    arch = runtime.ensure_init()
    if isinstance(config, str):
        config = load_config(config)
    batch = int(batch or (1 << 18 if arch == "cuda" else 1 << 13))
    if image:
        tiles = int(round(n_networks ** 0.5))
        if (n_input_dims, n_output_dims) != (2, 3) or tiles * tiles != n_networks:
            raise ValueError("image=True needs 2 inputs, 3 outputs and a square number of networks "
                             f"(got {n_input_dims}, {n_output_dims}, {n_networks}); pass image=False")
    dev = runtime.device()
    with recording() as built:
        if image:
            task = ImageTask(default_image(), tiles=tiles, seed=seed)
            trainer = Trainer.from_config(config, 2, 3, n_networks=task.n_networks, seed=seed)
            x, target, ids = task.batch(batch)
        else:
            trainer = Trainer.from_config(config, n_input_dims, n_output_dims, n_networks=n_networks, seed=seed)
            gen = torch.Generator().manual_seed(seed)
            x = torch.rand(batch, n_input_dims, generator=gen).to(dev)
            target = torch.rand(batch, n_output_dims, generator=gen).to(dev)
            ids = torch.randint(0, n_networks, (batch,), generator=gen, dtype=torch.int32).to(dev) \
                if n_networks > 1 else None
        with checks.disabled():  # as the demo: its batches need no scan
            loss = trainer.training_step(x, target, ids)
        float(loss)
        with trainer.inference_weights(), torch.no_grad():
            if image:
                task.render(trainer.model)
            else:
                trainer.model(x, ids)
        runtime.sync()
    return built


def main(argv=None) -> list[str]:
    p = argparse.ArgumentParser(prog="tinn-precompile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config_hash.json",
                   help="tcnn-style JSON config: a path, or the name of one shipped in tinn/configs "
                        "(default: config_hash.json)")
    p.add_argument("--arch", default=None, help="cpu, cuda or auto (default: TINN_ARCH or auto)")
    p.add_argument("--inputs", type=int, default=2, help="input dims (default 2, the image demo)")
    p.add_argument("--outputs", type=int, default=3, help="output dims (default 3)")
    p.add_argument("--networks", type=int, default=1, help="networks in the array (image: tiles^2)")
    p.add_argument("--batch", type=int, default=None, help="samples in the step (default: the demo's)")
    p.add_argument("--no-image", dest="image", action="store_false",
                   help="random inputs instead of the image demo's task")
    p.add_argument("--cache-dir", default=None, help="Taichi offline-cache directory (default: Taichi's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    kwargs = {"offline_cache_file_path": args.cache_dir} if args.cache_dir else {}
    arch = runtime.init(args.arch, **kwargs)
    built = precompile(args.config, args.inputs, args.outputs, n_networks=args.networks, batch=args.batch,
                       image=args.image)
    if args.json:
        json.dump({"arch": arch, "cache_dir": cache_dir(), "kernels": built}, sys.stdout)
        print()
    else:
        print(f"tinn.precompile on {arch}: {len(built)} kernel instances built, cached in {cache_dir()}")
        for name in built:
            print(f"  {name}")
    return built


def cli() -> int:
    """The `tinn-precompile` console script: `main` with an exit status instead of the kernel list."""
    main()
    return 0


if __name__ == "__main__":
    sys.exit(cli())

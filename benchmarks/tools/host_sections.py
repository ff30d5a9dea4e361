"""Host time of the image training step, by section: wall time inside selected functions, no syncs
(the GPU runs behind), so each figure is what that code costs the Python thread per step. Inclusive:
an outer section contains its inner ones."""
import collections
import functools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import tinn  # noqa: E402

tinn.init()
from tinn import networks, trainer as trainer_mod  # noqa: E402
from tinn.encodings import grid  # noqa: E402
from tinn.kernels import launch  # noqa: E402
from tinn import losses as loss_base  # noqa: E402
from tinn.optimizers import base as opt_base  # noqa: E402
from tinn.tasks.image import ImageTask, default_image  # noqa: E402

spent = collections.defaultdict(float)
calls = collections.Counter()


def timed(label, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t0
            calls[label] += 1
    return wrapper


def wrap(owner, name, label=None):
    setattr(owner, name, timed(label or f"{owner.__name__}.{name}", getattr(owner, name)))


wrap(ImageTask, "batch")
wrap(trainer_mod.Trainer, "training_step")
wrap(trainer_mod.Trainer, "_inputs")
wrap(trainer_mod.Trainer, "_uses_contract")
wrap(grid.GridEncoding, "lookup")
wrap(grid.GridEncoding, "lookup_backward")
wrap(networks.NetworkArray, "forward_ctx")
wrap(networks.NetworkArray, "backward")
wrap(networks.NetworkArray, "_gemm_weight_gradients")
wrap(networks.NetworkArray, "_fused_tiles")
for cls in vars(loss_base).values():
    if isinstance(cls, type) and "evaluate" in vars(cls):
        wrap(cls, "evaluate")
wrap(opt_base.Optimizer, "step")
wrap(opt_base.Optimizer, "zero_grad")
_orig_call = launch.FastKernel.__call__


def kernel_call(self, *args):
    t0 = time.perf_counter()
    try:
        return _orig_call(self, *args)
    finally:
        spent["launch " + self.__name__] += time.perf_counter() - t0
        calls["launch " + self.__name__] += 1


launch.FastKernel.__call__ = kernel_call

task = ImageTask(default_image(256))
trainer = trainer_mod.Trainer.from_config(tinn.load_config("configs/config_hash.json"), 2, 3)
tinn.checks.set_enabled(False)
batch = 1 << int(os.environ.get("LOG2_BATCH", 18))
for _ in range(10):
    trainer.training_step(*task.batch(batch))
tinn.runtime.sync()
spent.clear()
calls.clear()
n = 200
for rep in range(n):
    trainer.training_step(*task.batch(batch))
    if rep % 8 == 7:
        tinn.runtime.sync()  # keep the launch queue short so no launch blocks on a full queue
tinn.runtime.sync()
print(f"{'section':52s} {'calls/step':>10s} {'us/step':>9s}")
for label, t in sorted(spent.items(), key=lambda kv: -kv[1]):
    print(f"{label:52s} {calls[label] / n:10.1f} {t * 1e6 / n:9.1f}")

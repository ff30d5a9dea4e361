"""Host time of the image training step, by section: wall time inside selected functions, no syncs
(the GPU runs behind), so each figure is what that code costs the Python thread per step. Inclusive:
an outer section contains its inner ones."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
import tinn  # noqa: E402

tinn.init()
from tinn import networks, trainer as trainer_mod  # noqa: E402
from tinn.encodings import grid  # noqa: E402
from tinn import losses as loss_base  # noqa: E402
from tinn.optimizers import base as opt_base  # noqa: E402
from tinn.tasks.image import ImageTask, default_image  # noqa: E402
from common import Sections  # noqa: E402

sections = Sections()
wrap = sections.wrap
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
sections.wrap_launches()

task = ImageTask(default_image(256))
trainer = trainer_mod.Trainer.from_config(tinn.load_config("tinn/configs/config_hash.json"), 2, 3)
tinn.checks.set_enabled(False)
batch = 1 << int(os.environ.get("LOG2_BATCH", 18))
for _ in range(10):
    trainer.training_step(*task.batch(batch))
tinn.runtime.sync()
sections.clear()
n = 200
for rep in range(n):
    trainer.training_step(*task.batch(batch))
    if rep % 8 == 7:
        tinn.runtime.sync()  # keep the launch queue short so no launch blocks on a full queue
tinn.runtime.sync()
print(f"{'section':52s} {'calls/step':>10s} {'us/step':>9s}")
for row in sections.rows(n):
    print(f"{row['section']:52s} {row['calls']:10.1f} {row['us']:9.1f}")

"""Host-side cost of the image training step: cProfile over steady-state steps (GPU work runs async)."""
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import tinn  # noqa: E402

tinn.init()
from tinn.tasks.image import ImageTask, default_image  # noqa: E402
from tinn.trainer import Trainer  # noqa: E402

task = ImageTask(default_image(256))
trainer = Trainer.from_config(tinn.load_config("configs/config_hash.json"), 2, 3)
tinn.checks.set_enabled(False)
for _ in range(5):
    trainer.training_step(*task.batch(1 << 18))
tinn.runtime.sync()
prof = cProfile.Profile()
prof.enable()
for _ in range(50):
    trainer.training_step(*task.batch(1 << 18))
tinn.runtime.sync()
prof.disable()
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(22)
stats.sort_stats("cumulative").print_stats(30)

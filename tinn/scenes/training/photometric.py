"""Scene objectives for `tinn.Trainer`: photometric training of a field on posed images.

Each scene phase is a loss callable handed to the one training loop (`Trainer.optimize`); the
learning-rate decay is the optimizer's `ExponentialDecay` wrapper (`decaying_adam`), not a loop's own.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import checks, runtime
from ...errors import InputError
from ...trainer import Trainer, TrainerControls
from ...render.fields import RaySamples, sample_rays, shade
from ...render.rays import ray_box

NERF_ADAM = {"otype": "Adam", "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-15}


def decaying_adam(learning_rate: float, total_steps: int | None = None, final_lr_factor: float = 0.1,
                  **adam_options) -> dict:
    """tinn's Adam with NeRF-style moments (beta2 0.99, tiny epsilon: hash-table entries see sparse gradients),
    its rate decaying exponentially from `learning_rate` to `learning_rate * final_lr_factor` over
    `total_steps` (constant when None): an `ExponentialDecay` that multiplies the rate by
    final_lr_factor^(1/total_steps) before each step 1..total_steps."""
    adam = {**NERF_ADAM, **adam_options, "learning_rate": float(learning_rate)}
    if not total_steps:
        return adam
    return {"otype": "ExponentialDecay", "decay_base": float(final_lr_factor) ** (1.0 / total_steps),
            "decay_start": 1, "decay_interval": 1, "decay_end": int(total_steps), "nested": adam}


class SceneTrainer(TrainerControls):
    """A scene phase: an objective (`loss()`) and the `Trainer` that optimises it; `step()` is one step.

    Steps run without the sync checks (`tinn.checks.disabled`): their inputs are built by the phase itself
    (points in the box, cell ids, ray offsets), and each check would stall the host until the device drains.
    """

    trainer: Trainer

    def loss(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self) -> torch.Tensor:
        with checks.disabled():
            return self.trainer.optimize(self.loss)

    @property
    def optimizer(self):
        return self.trainer.optimizer

    @property
    def step_count(self) -> int:
        return self.trainer.step

    def reset(self) -> None:
        self.trainer.reset()


@dataclass
class RayBatch:
    """One step's training rays: target colours, the background they were composited on, the samples."""
    colors: torch.Tensor
    background: torch.Tensor
    samples: RaySamples
    key: tuple  # what the batch was drawn for (see PhotometricTrainer._batch_key)


class PhotometricTrainer(SceneTrainer):
    """Trains a field on posed images: each `step()` renders `batch_rays` random training rays (jittered samples,
    empty space skipped when an occupancy grid is given) and takes one Adam step on the mean squared colour error.

    The learning rate decays exponentially from `learning_rate` to `learning_rate * final_lr_factor` over
    `total_steps` (constant when total_steps is None); `adam_options` override the other Adam settings
    (`NERF_ADAM`, e.g. beta2 or l2_reg). With a tracking occupancy grid
    (`OccupancyGrid.tracking`) and `occupancy_threshold`, the grid follows the field: every
    `occupancy_every` steps it is updated from the field's density, so training and rendering skip
    the space the field leaves empty.

    Images read with an alpha channel (`data.alpha`) train, with `random_background` (the default), on a
    random background per ray: the pixel is composited anew on it and the render uses the same colour, so
    the field cannot paint the fixed background into empty space (instant-ngp does the same).

    Each step draws the next step's rays and samples before evaluating its own, so that the number of samples to
    evaluate reaches the host while the device works: the step does not wait for the device. A step followed by a
    grid update runs that update after its optimizer step (the field is then what the next step starts with) and
    then draws the next batch from the updated grid. The batches, random numbers and grid updates are those of
    updating the grid and drawing each batch in their own step. The last of `total_steps` (when given) leaves an
    update due next to the step it belongs to, so a phase that ends leaves its grid as its last step left it.
    """

    def __init__(self, field, data, n_samples: int, batch_rays: int, learning_rate: float, occupancy=None,
                 total_steps: int | None = None, final_lr_factor: float = 0.1, seed: int = 0,
                 occupancy_threshold: float | None = None, occupancy_every: int = 16, random_background: bool = True,
                 adam_options: dict | None = None):
        if isinstance(batch_rays, bool) or not isinstance(batch_rays, int) or batch_rays < 1:
            raise InputError(f"batch_rays={batch_rays!r} must be an integer >= 1")
        self.field, self.n_samples, self.batch_rays, self.occupancy = field, int(n_samples), batch_rays, occupancy
        dev = runtime.device()
        origins, directions, colors = data.rays()
        self.origins = origins.to(dev, torch.float32).contiguous()
        self.directions = directions.to(dev, torch.float32).contiguous()
        self.colors = colors.to(dev, torch.float32).contiguous()
        self.background = data.background.to(dev, torch.float32)
        alpha = data.alphas() if random_background else None
        self.alpha = None if alpha is None else alpha.to(dev, torch.float32).contiguous()
        # Each ray's span in the field's box, computed once (per ray, so the same numbers as per batch).
        self.t_near, self.t_far = ray_box(self.origins, self.directions, field.box_min, field.box_max)
        # Checked once here: the steps run without the sync checks.
        data_tensors = (self.origins, self.directions, self.colors) + (() if self.alpha is None else (self.alpha,))
        if not bool(torch.stack([checks.all_finite(t) for t in data_tensors]).all()):
            raise InputError("the training data's rays, colours or alphas contain NaN or Inf")
        self.trainer = Trainer(field, self.loss,
                               decaying_adam(learning_rate, total_steps, final_lr_factor, **(adam_options or {})))
        self.generator = torch.Generator(device=dev).manual_seed(seed)
        tracks = occupancy is not None and occupancy.density is not None
        if tracks and occupancy_threshold is None:
            raise InputError("a tracking occupancy grid needs occupancy_threshold (the density that counts as matter)")
        if isinstance(occupancy_every, bool) or not isinstance(occupancy_every, int) or occupancy_every < 1:
            raise InputError(f"occupancy_every={occupancy_every!r} must be an integer >= 1 (steps)")
        self.occupancy_threshold = occupancy_threshold if tracks else None
        self.occupancy_every = occupancy_every
        self.total_steps = total_steps
        self._ahead: RayBatch | None = None  # the next step's batch, drawn during this one
        # (step, grid) of a grid update that the step before ran for that step (see step)
        self._updated_for: tuple[int, object] | None = None

    def _updates_at(self, step: int) -> bool:
        return self.occupancy_threshold is not None and step % self.occupancy_every == 0

    def step(self) -> torch.Tensor:
        ran = self._updated_for
        if self._updates_at(self.trainer.step) and not (ran is not None and ran[0] == self.trainer.step
                                                        and ran[1] is self.occupancy):
            self._update_grid()
        loss = super().step()
        # The next step's update and batch, issued now (the field is what that step starts with, and the
        # generator draws in the same order: update, then batch), so that the next step finds its batch drawn
        # and its sample count on the way to the host, as every other step does, and issues its own next batch
        # before it reads that count.
        upcoming = self.trainer.step
        if self._updates_at(upcoming) and upcoming != self.total_steps:
            self._update_grid()
            self._updated_for = (upcoming, self.occupancy)
            with checks.disabled():
                self._ahead = self.draw_batch()
        return loss

    def _update_grid(self) -> None:
        with checks.disabled():
            self.occupancy.update(self.field.density, self.occupancy_threshold, generator=self.generator)

    def reset(self) -> None:
        """Back to step 0 (see `SceneTrainer.reset`); the grid keeps its state, and a grid update already run for
        the next step stays run (step 0 updates the grid again)."""
        super().reset()
        self._ahead = None
        self._updated_for = None

    def _batch_key(self) -> tuple:
        """What a batch depends on besides the random numbers: a batch drawn ahead is used only if these are
        unchanged (a grid updated or replaced in between makes the step draw its batch anew)."""
        occupied = None if self.occupancy is None else self.occupancy.occupied
        return (self.batch_rays, self.n_samples, self.occupancy, occupied,
                None if occupied is None else occupied._version)

    def draw_batch(self) -> RayBatch:
        """`batch_rays` random training rays (with random backgrounds where the images have alpha) and their
        jittered samples; only device work is issued."""
        pick = torch.randint(0, self.origins.shape[0], (self.batch_rays,), device=self.origins.device,
                             generator=self.generator)
        colors, background = self.colors[pick], self.background
        if self.alpha is not None:
            background = torch.rand(self.batch_rays, 3, device=colors.device, generator=self.generator)
            colors = colors + (1.0 - self.alpha[pick]) * (background - self.background)
        samples = sample_rays(self.field.box_min, self.field.box_max, self.origins[pick], self.directions[pick],
                              self.n_samples, self.occupancy, jitter=True, generator=self.generator,
                              spans=(self.t_near[pick], self.t_far[pick]))
        return RayBatch(colors, background, samples, self._batch_key())

    def loss(self) -> torch.Tensor:
        ahead, self._ahead = self._ahead, None
        batch = ahead if ahead is not None and _same_key(ahead.key, self._batch_key()) else self.draw_batch()
        # The next step's batch, drawn now (the same random numbers in the same order as drawing it then) unless
        # that step updates the grid first: then `step` draws it after the update (the update draws from the
        # generator, and the batch samples the new grid).
        if not self._updates_at(self.trainer.step + 1):
            self._ahead = self.draw_batch()
        out = shade(self.field, batch.samples, batch.background)
        return ((out.rgb - batch.colors) ** 2).mean()


def _same_key(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y or (type(x) is type(y) and isinstance(x, int) and x == y)
                                    for x, y in zip(a, b))

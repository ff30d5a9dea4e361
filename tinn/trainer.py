"""`Trainer`: model + loss + optimizer, tcnn style.

`training_step(inputs, targets, net_ids)` runs forward, the loss kernel (which
yields dLoss/dprediction directly), the hand-written backward, and one optimizer
step. On tinn's own models the backward kernels are called directly
(`direct_step.py`); any other torch module goes through torch autograd. It
returns the loss as a 0-d tensor so the caller decides when to sync.
"""
from __future__ import annotations

import os

import torch

from . import checkpoint, checks
from .config import Section
from .direct_step import DirectStep
from .errors import InputError
from .losses import create_loss
from .models import NetworkWithInputEncoding
from .optimizers import create_optimizer


# The sections of a trainer config (tcnn's sample config); any other top-level key is an error.
TRAINER_OPTIONS = ("loss", "optimizer", "encoding", "network")


class Trainer:
    def __init__(self, model: torch.nn.Module, loss=None, optimizer=None, config: dict | None = None,
                 track_per_network_loss: bool = False):
        self.model = model
        self.loss = loss if loss is not None and not isinstance(loss, (dict, Section)) else \
            create_loss(loss or {"otype": "L2"})
        self.optimizer = optimizer if optimizer is not None and not isinstance(optimizer, (dict, Section)) else \
            create_optimizer(optimizer or {"otype": "Adam"}, list(model.named_parameters()))
        self.config = config or {}
        self.track_per_network_loss = track_per_network_loss
        self.per_network_loss: torch.Tensor | None = None
        self.step = 0
        # tinn's own models step without torch autograd (see direct_step.py); others go through autograd.
        self._direct = DirectStep.for_model(model)

    @classmethod
    def from_config(cls, config: dict, n_input_dims: int, n_output_dims: int, n_networks: int = 1,
                    seed: int = 1337, **kwargs) -> "Trainer":
        """Build model, loss and optimizer from a tcnn config with `loss`/`optimizer`/`encoding`/`network`."""
        root = Section(config, "")
        root.expect_keys(TRAINER_OPTIONS, "a trainer config")
        model = NetworkWithInputEncoding(
            n_input_dims, n_output_dims,
            root.section("encoding", required=False).data or {"otype": "Identity"},
            root.section("network", required=True),
            n_networks=n_networks, seed=seed,
        )
        loss = create_loss(root.section("loss", required=False).data or {"otype": "L2"})
        optimizer = create_optimizer(root.section("optimizer", required=False).data or {"otype": "Adam"},
                                     list(model.named_parameters()))
        return cls(model, loss, optimizer, config=config, **kwargs)

    @property
    def n_networks(self) -> int:
        return getattr(self.model, "n_networks", 1)

    def _inputs(self, inputs, targets, net_ids):
        x = checks.float_input("inputs", inputs, self.model.n_input_dims)
        t = checks.float_input("targets", targets, self.model.n_output_dims)
        if t.shape[0] != x.shape[0]:
            raise InputError(f"targets has batch {t.shape[0]} but inputs has batch {x.shape[0]}")
        with checks.disabled():  # the range check is part of the one-sync check below
            ids = checks.net_ids(net_ids, x.shape[0], self.n_networks)
        checks.training_batch("inputs", x, "targets", t, ids if net_ids is not None else None, self.n_networks)
        return x, t, ids

    def training_step(self, inputs: torch.Tensor, targets: torch.Tensor, net_ids: torch.Tensor | None = None,
                      run_optimizer: bool = True) -> torch.Tensor:
        x, t, ids = self._inputs(inputs, targets, net_ids)
        self.optimizer.zero_grad()

        def loss_of(pred):
            return self.loss.evaluate(pred.detach(), t, net_ids=ids if self.track_per_network_loss else None,
                                      n_networks=self.n_networks if self.track_per_network_loss else None)

        with checks.disabled():  # already validated
            if self._direct is not None and self._direct.applies(x.shape[0]):
                result = self._direct.run(x, ids, loss_of)  # same kernels and gradients, no autograd graph
            else:
                pred = self.model(x, ids)
                result = loss_of(pred)
                pred.backward(result.grad)
        if run_optimizer:
            self.optimizer.step()
            self.step += 1
        if self.track_per_network_loss:
            self.per_network_loss = result.per_network
        return result.value

    def inference(self, inputs: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Evaluate with the optimizer's inference weights (EMA / Average / Lookahead averages, else live)."""
        with torch.no_grad(), self.optimizer.swap_in_inference_params():
            return self.model(inputs, net_ids)

    def inference_weights(self):
        """Context in which `self.model` holds the inference weights (e.g. to render a whole image)."""
        return self.optimizer.swap_in_inference_params()

    @property
    def learning_rate(self) -> float:
        return self.optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self.optimizer.learning_rate = value

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        checkpoint.save(path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                               "trainer": {"step": self.step}}, metadata={"config": self.config})

    def load_checkpoint(self, path: str | os.PathLike, strict_config: bool = True) -> dict:
        """Restore model, optimizer and step, all or nothing (see `checkpoint.restore_trainer`); a checkpoint
        saved with another config is refused unless `strict_config=False`. Returns its metadata."""
        return checkpoint.restore_trainer(self, path, strict_config=strict_config)

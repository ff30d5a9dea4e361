"""`Trainer`: model + loss + optimizer, tcnn style, and the one training loop of tinn.

`training_step(inputs, targets, net_ids)` runs forward, the loss (which yields dLoss/dprediction
itself), the backward and one optimizer step. On a model that follows the part contract
(tinn/part.py) it calls the contract's `forward_with_context` and `backward` directly, with no autograd
bookkeeping; any other torch module, a part with hooks or a subclass with its own forward goes
through torch autograd and gets the same gradients.

`optimize(objective)` is the step of tasks whose loss is not a per-sample regression (volume
rendering, distillation): `objective()` returns a scalar loss built with autograd. Learning-rate
schedules live in the optimizer (`ExponentialDecay` and the other wrappers), not in the loops.
`reset()` puts model and optimizer back to their initial state.

Networks computing in float16 scale their gradients dynamically (tinn/gradient_scaling.py): after each
backward their scalers turn the step's overflow record into a device flag, and the optimizer skips its update
where the flag is set, reading it on the device (`Optimizer.step(skip=...)`; optimizers without
`skips_on_device` read it on the host). A step thus never waits for the GPU. `step` counts the training
steps run, taken or skipped; `skipped_steps` and `gradient_scale` read the device (a sync) when asked.
"""
from __future__ import annotations

import os

import torch

from . import checkpoint, checks, gradient_scaling, runtime, step_graphs
from .config import Section
from .errors import InputError
from .losses import Loss, LossResult, create_loss
from .models import NetworkWithInputEncoding
from .optimizers import create_optimizer
from .part import NextBatch, Part, has_hooks

# What a Trainer called inside the caller's own CUDA graph capture is told to do instead.
_TRAINER_CAPTURES = ("call the Trainer outside it: on CUDA it replays its own regression steps from CUDA graphs "
                     "(tuning.step_graphs)")

_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _observed(model: torch.nn.Module) -> bool:
    """Whether hooks would see the difference between the contract step and autograd."""
    module_mod = torch.nn.modules.module
    if any(getattr(module_mod, name, None) for name in _GLOBAL_HOOKS):
        return True
    if any(has_hooks(m) for m in model.modules()):
        return True
    return any(p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None) for p in model.parameters())


def _accumulate_grad(p: torch.Tensor, grad: torch.Tensor) -> None:
    """What autograd's gradient accumulation does for a leaf: take the buffer, or add into `.grad`."""
    if p.grad is None:
        p.grad = grad
    else:
        p.grad += grad


def _batch_of_three(batch) -> tuple:
    """A batch of `Trainer.training_steps` as its (inputs, targets, net_ids)."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 3:
        length = f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""
        raise InputError("training_steps takes batches of (inputs, targets, net_ids); got "
                         f"{type(batch).__name__}{length}")
    return tuple(batch)


def _loss_result(loss, pred: torch.Tensor, target: torch.Tensor, **kwargs) -> LossResult:
    """A tinn loss evaluates value and gradient in one kernel; any other callable `loss(pred, target)`
    is differentiated with autograd."""
    if hasattr(loss, "evaluate"):
        return loss.evaluate(pred, target, **kwargs)
    leaf = pred.detach().requires_grad_()
    with torch.enable_grad():
        value = loss(leaf, target)
        with runtime.autograd_backward_here():
            (grad,) = torch.autograd.grad(value, leaf)
    return LossResult(value.detach(), grad)


def _build_optimizer(model: torch.nn.Module, config):
    """The optimizer of `model`'s parameters from a config: the model's own `build_optimizer` where it has one
    (a Replicated part may split the optimizer over ranks), else `create_optimizer`."""
    build = getattr(model, "build_optimizer", None)
    if callable(build):
        return build(config)
    return create_optimizer(config, list(model.named_parameters()))


# The sections of a trainer config (tcnn's sample config); any other top-level key is an error.
TRAINER_OPTIONS = ("loss", "optimizer", "encoding", "network")


class LearningRateOf:
    """`learning_rate` read and written through the attribute named by `learning_rate_owner` (the
    Trainer's optimizer; the trainer of a scene phase or a viewer source)."""

    learning_rate_owner = "trainer"

    @property
    def learning_rate(self) -> float:
        return getattr(self, self.learning_rate_owner).learning_rate

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        getattr(self, self.learning_rate_owner).learning_rate = value


class Trainer(LearningRateOf):
    """A model, its loss and its optimizer, trained one step at a time (tcnn's `Trainer`).

    Build one from a tcnn-style config with `Trainer.from_config`, or around your own model. Each
    `training_step` runs forward, loss, backward and one optimizer step, and returns the loss
    without waiting for the device; `learning_rate` reads and sets the optimizer's.

    Args:
        model: a torch module taking `(inputs, net_ids)`: a tinn part (`NetworkWithInputEncoding`,
            `NetworkArray`, ...), which trains without autograd bookkeeping, or any other module.
        loss: a tinn `Loss`, a tcnn-style loss config, or any callable `loss(pred, target)` returning
            a scalar; default L2.
        optimizer: a tinn optimizer or a tcnn-style optimizer config; default Adam over the model's
            parameters.
        config: the config the trainer was built from; saved in checkpoints and compared on load.
        track_per_network_loss: keep each network's mean loss of the last step in `per_network_loss`.

    Example:
        >>> trainer = Trainer.from_config(tinn.load_config("config.json"), 2, 3, n_networks=4)
        >>> loss = trainer.training_step(x, target, net_ids)
    """

    learning_rate_owner = "optimizer"

    def __init__(self, model: torch.nn.Module, loss=None, optimizer=None, config: dict | None = None,
                 track_per_network_loss: bool = False):
        self.model = model
        self.loss = loss if loss is not None and not isinstance(loss, (dict, Section)) else \
            create_loss({"otype": "L2"} if loss is None else loss)
        self.optimizer = optimizer if optimizer is not None and not isinstance(optimizer, (dict, Section)) else \
            _build_optimizer(model, {"otype": "Adam"} if optimizer is None else optimizer)
        self.config = config or {}
        self.track_per_network_loss = track_per_network_loss
        self.per_network_loss: torch.Tensor | None = None
        self.step = 0
        self._step_graphs = None  # tinn/step_graphs.py, made with the first step that may be captured
        self._attach_scalers(fresh=False)

    @classmethod
    def from_config(cls, config: dict, n_input_dims: int, n_output_dims: int, n_networks: int = 1,
                    seed: int = 1337, **kwargs) -> "Trainer":
        """Build model, loss and optimizer from a tcnn config.

        Args:
            config: a dict with `network` and optionally `encoding`, `loss` and `optimizer`, as
                `tinn.load_config` returns it. As tcnn's `create_from_config`, an absent section is an
                empty one and a section without `otype` takes tcnn's default: RelativeL2 loss, OneBlob
                encoding, Adam optimizer.
            n_input_dims: input width of the model.
            n_output_dims: output width of the model.
            n_networks: how many networks of that shape (one encoding and one MLP each).
            seed: initialisation seed.
            **kwargs: passed to the constructor (e.g. `track_per_network_loss=True`).

        Returns:
            The trainer, its model a `NetworkWithInputEncoding`.

        Raises:
            ConfigError: a missing `network`, an unknown top-level key, or a bad value in a section
                (the message names the key path and the allowed values).
        """
        root = Section(config, "")
        root.expect_keys(TRAINER_OPTIONS, "a trainer config")
        model = NetworkWithInputEncoding(
            n_input_dims, n_output_dims,
            root.section("encoding", required=False),
            root.section("network", required=True),
            n_networks=n_networks, seed=seed,
        )
        loss = create_loss(root.section("loss", required=False))
        optimizer = create_optimizer(root.section("optimizer", required=False), list(model.named_parameters()))
        return cls(model, loss, optimizer, config=config, **kwargs)

    @property
    def n_networks(self) -> int:
        """How many networks the model holds (1 for a model without `n_networks`)."""
        return getattr(self.model, "n_networks", 1)

    def _inputs(self, inputs, targets, net_ids):
        x = checks.float_input("inputs", inputs, self.model.n_input_dims)
        t = checks.float_input("targets", targets, self.model.n_output_dims)
        if t.shape[0] != x.shape[0]:
            raise InputError(f"targets has batch {t.shape[0]} but inputs has batch {x.shape[0]}")
        with checks.disabled():  # the range check is part of the one-sync check below
            ids = checks.net_ids(net_ids, x.shape[0], self.n_networks)
        checks.training_batch("inputs", x, "targets", t, net_ids, self.n_networks)
        return x, t, ids

    def _uses_contract(self, batch: int) -> bool:
        model = self.model
        if not isinstance(model, Part) or not model.direct_training:
            return False
        # An empty batch goes through autograd, except for a part whose ranks must all make the same calls (a
        # sharded array): its steps take the same path whatever a rank's batch.
        if batch == 0 and not getattr(model, "collective_calls", False):
            return False
        if not any(t is not None and t.requires_grad for t in model.parameter_tables()):
            return False
        return not _observed(model)

    # ---- steps ------------------------------------------------------------------------------------
    def training_step(self, inputs: torch.Tensor, targets: torch.Tensor, net_ids: torch.Tensor | None = None,
                      run_optimizer: bool = True) -> torch.Tensor:
        """One regression step: forward, loss, backward and (unless `run_optimizer=False`) an optimizer step.

        Args:
            inputs: (batch, n_input_dims) float tensor on the device.
            targets: (batch, n_output_dims) float tensor.
            net_ids: (batch,) int tensor, each sample's network in [0, n_networks); None for one network.
            run_optimizer: False leaves the gradients in the parameters' `.grad` and takes no step.

        Returns:
            The loss as a 0-d tensor; reading it (`float(loss)`) waits for the device, so the caller
            decides when to sync. On a sharded array (`tinn.distributed.ShardedPart`) whose step computes each
            loss where its network lives, the mean over ranks of each rank's loss, the same on every rank.

        Raises:
            InputError: wrong shapes or dtypes, mismatched batches, ids out of range, or non-finite
                inputs (unless `tinn.checks.disabled()`).
        """
        step_graphs.refuse_in_callers_capture("Trainer.training_step", _TRAINER_CAPTURES)
        x, t, ids = self._inputs(inputs, targets, net_ids)
        if run_optimizer and not self.track_per_network_loss and self._graphs_apply(x):
            value = self._step_graphs.step(x, t, ids)
            if value is not None:
                return value
        return self._regression_step(x, t, ids, run_optimizer)

    def training_steps(self, batches):
        """One `training_step` per batch, as a generator of the steps' losses:

            for loss in trainer.training_steps((x, target, ids) for x, target, ids in loader):
                ...

        Args:
            batches: an iterable of (inputs, targets, net_ids) tuples, as `training_step` takes them.

        Yields:
            Each step's loss, as `training_step` returns it (not waited for).

        Knowing the next batch lets a sharded array (`tinn.distributed.ShardedPart`, with the loss at the owners)
        route it to its owners while the current step computes (tinn/distributed/route_ahead.py): no step waits
        for its routing. The generator takes up to two batches ahead of the step it runs; each step trains on its
        batch as it was when taken. Every rank must give the same number of batches; ranks whose batches end at
        different steps raise a DistributedError. Other models train exactly as `training_step` does.

        Raises:
            InputError: a batch that is not (inputs, targets, net_ids), and as `training_step`, for the batch taken.
        """
        step_graphs.refuse_in_callers_capture("Trainer.training_steps", _TRAINER_CAPTURES)
        batches = (_batch_of_three(b) for b in batches)
        first = next(batches, None)
        if first is None:
            return
        model = self.model
        inputs = first[0]
        routes_ahead = getattr(model, "routes_ahead", None)
        if not (routes_ahead and routes_ahead(self.loss) and not self.track_per_network_loss
                and isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and self._uses_contract(inputs.shape[0])):
            # (training_step refuses a batch of the wrong kind by name)
            yield self.training_step(*first)
            for batch in batches:
                yield self.training_step(*batch)
            return

        def take():
            batch = next(batches, None)
            return None if batch is None else self._inputs(*batch)

        current = self._inputs(*first)
        following = take()
        after = None if following is None else take()
        try:
            while current is not None:
                ahead = None
                if following is not None:
                    nx, nt, nids = following
                    ahead = NextBatch(nx, nids, nt, then=after is not None)
                yield self._regression_step(*current, ahead=ahead)
                current, following = following, after
                after = None if following is None else take()
        finally:
            model.drop_ahead()

    def _graphs_apply(self, x: torch.Tensor) -> bool:
        """Whether this step may be replayed from a CUDA graph (tinn/step_graphs.py): `tuning.step_graphs` on, CUDA,
        the part contract's path with the loss taken by the model's backward."""
        # The path measured and tested: a tinn loss the model's backward takes itself (no autograd inside the
        # step), on one process's part, or, opted in (`tuning.replicated_step_graphs`), on a part whose
        # collectives a graph holds (a Replicated part over NCCL; a sharded part reads its exchange's header on
        # the host).
        collectives = getattr(self.model, "collective_calls", False)
        if (not step_graphs.StepGraphs.wanted(x.device) or not isinstance(self.loss, Loss)
                or (collectives and not (runtime.tuning().replicated_step_graphs
                                         and getattr(self.model, "graph_safe_collectives", bool)()))
                or not self._uses_contract(x.shape[0]) or not self.model.fuses_loss()):
            return False
        if self._step_graphs is None:
            self._step_graphs = step_graphs.StepGraphs(self)
        return True

    @property
    def step_graph_status(self) -> str:
        """Whether this trainer's steps are replayed from CUDA graphs, and if not, why (tinn/step_graphs.py)."""
        return "steps issued op by op" if self._step_graphs is None else self._step_graphs.status

    def _regression_step(self, x, t, ids, run_optimizer: bool = True, ahead=None) -> torch.Tensor:
        """`training_step` on validated inputs, issued op by op (and so captured, tinn/step_graphs.py). `ahead`: the
        next step's batch, for a model that routes it while this step computes (`training_steps`)."""
        self.optimizer.zero_grad()
        track = self.track_per_network_loss
        kwargs = {"net_ids": ids, "n_networks": self.n_networks} if track else {}
        with checks.disabled(), runtime.stream_guard():  # inputs validated above
            if self._uses_contract(x.shape[0]):
                model = self.model
                if isinstance(self.loss, Loss) and not track and model.fuses_loss():
                    # The model's backward takes the loss itself: the fused MLP computes its gradient where
                    # its kernel first reads the outputs, the tensor cores' where the backward recomputes them
                    # (Part.gradients_from_loss: no output is kept, and that backward needs no forward).
                    routing_ahead = {} if ahead is None else {"ahead": ahead}
                    _, grads, value = model.gradients_from_loss(x, ids, self.loss, t, need_dx=False, **routing_ahead)
                    result = LossResult(value, None)
                else:
                    pred, ctx = model.forward_with_context(x, ids, train=True)
                    result = _loss_result(self.loss, pred, t, **kwargs)
                    del pred  # its memory is reused by the backward where the model's context does not keep it
                    _, grads = model.backward(ctx, result.grad.contiguous(), need_dx=False)
                for table, grad in zip(model.parameter_tables(), grads):
                    if table is not None and table.requires_grad and grad is not None:
                        _accumulate_grad(table, grad)
            else:
                pred = self.model(x, ids)
                result = _loss_result(self.loss, pred.detach(), t, **kwargs)
                with runtime.autograd_backward_here():
                    pred.backward(result.grad)
        if run_optimizer:
            self._optimizer_step()
        if track:
            self.per_network_loss = result.per_network
        return result.value

    def optimize(self, objective=None, run_optimizer: bool = True) -> torch.Tensor:
        """One step on `objective()`, a scalar loss built with autograd (rendering, distillation).

        Args:
            objective: a callable returning a 0-d loss tensor; default the trainer's `loss`.
            run_optimizer: False leaves the gradients in `.grad` and takes no step.

        Returns:
            The loss, detached.

        Raises:
            InputError: the objective did not return a 0-d tensor.
        """
        step_graphs.refuse_in_callers_capture("Trainer.optimize", _TRAINER_CAPTURES)
        objective = self.loss if objective is None else objective
        self.optimizer.zero_grad()
        with runtime.stream_guard():
            loss = objective()
            if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                raise InputError(f"the objective must return a 0-d loss tensor, got "
                                 f"{type(loss).__name__}{tuple(getattr(loss, 'shape', ()))}")
            with runtime.autograd_backward_here():
                loss.backward()
        if run_optimizer:
            self._optimizer_step()
        return loss.detach()

    def _attach_scalers(self, fresh: bool) -> None:
        """The model's gradient scalers (reset where `fresh`), the device count of skipped steps, and the
        buffer of the combined skip flag of several scalers."""
        self.gradient_scalers = gradient_scaling.scalers_of(self.model)
        if fresh:
            for scaler in self.gradient_scalers:
                scaler.reset()
        device = self.gradient_scalers[0].scale.device if self.gradient_scalers else None
        self._skipped = torch.zeros(1, dtype=torch.int32, device=device) if device is not None else None
        self._skip_flag = torch.zeros(1, dtype=torch.int32, device=device) if device is not None else None

    def _optimizer_step(self) -> None:
        """The optimizer's step; where a float16 network's gradients overflowed (its scaler backs off), the
        optimizer leaves parameters and state as they are, decided on the device."""
        self.step += 1
        if not self.gradient_scalers:
            self.optimizer.step()
            return
        # The flag's torch ops and the optimizer's Taichi kernels that read it, in one stream order.
        with runtime.stream_guard():
            skip = gradient_scaling.skip_flag(self.gradient_scalers, out=self._skip_flag)
            self._skipped.add_(skip)
            self.optimizer.step(skip=skip)

    @property
    def skipped_steps(self) -> int:
        """Training steps whose optimizer update was skipped for overflowing float16 gradients (reads the
        device)."""
        return 0 if self._skipped is None else int(self._skipped.item())

    @property
    def gradient_scale(self) -> float | None:
        """The current gradient scale of the model's (first) float16 network, None without one (reads the
        device)."""
        return self.gradient_scalers[0].value if self.gradient_scalers else None

    def gradient_scaling_state(self) -> dict:
        """The skip count and every scaler's state (device tensors, copied), for checkpoints; empty without
        float16 networks."""
        if not self.gradient_scalers:
            return {}
        state = {"skipped_steps": self._skipped.clone()}
        for i, scaler in enumerate(self.gradient_scalers):
            state.update({f"gradient_scaler.{i}.{k}": v for k, v in scaler.state_dict().items()})
        return state

    def load_gradient_scaling(self, state: dict | None) -> None:
        """Restore `checkpoint`'s parsed scaling state: the scalers' states where the checkpoint holds one for
        each of this model's scalers; otherwise (saved where the networks ran another precision) fresh ones."""
        if not self.gradient_scalers:
            return
        if state is None or len(state["scalers"]) != len(self.gradient_scalers):
            for scaler in self.gradient_scalers:
                scaler.reset()
            self._skipped.zero_()
            return
        for scaler, scaler_state in zip(self.gradient_scalers, state["scalers"]):
            scaler.load_state_dict(scaler_state)
        self._skipped.copy_(state["skipped_steps"].reshape(1))

    def summary(self) -> dict:
        """Steps run, steps skipped for overflowing float16 gradients and the current gradient scale (reads the
        device)."""
        return {"step": self.step, "skipped_steps": self.skipped_steps, "gradient_scale": self.gradient_scale}

    def inference(self, inputs: torch.Tensor, net_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Evaluate without gradients, with the optimizer's inference weights.

        Args:
            inputs: (batch, n_input_dims) float tensor.
            net_ids: (batch,) int tensor of network ids; None for one network.

        Returns:
            (batch, n_output_dims) predictions, made with the EMA / Average / Lookahead averages when the
            optimizer keeps them, else with the live weights.
        """
        with torch.no_grad(), self.optimizer.swap_in_inference_params():
            return self.model(inputs, net_ids)

    def inference_weights(self):
        """Context in which `self.model` holds the inference weights (e.g. to render a whole image)."""
        return self.optimizer.swap_in_inference_params()

    def reset(self, seed: int | None = None) -> None:
        """Model parameters re-initialised (tinn parts from their own seeds, or from `seed`; other torch
        modules by their `reset_parameters()`), optimizer state and step count back to the start; the
        configuration stays."""
        with torch.no_grad():
            for m in self.model.modules():
                reset = getattr(m, "reset_parameters", None)
                if callable(reset):
                    reset(seed) if isinstance(m, Part) and seed is not None else reset()
        self.optimizer = _build_optimizer(self.model, self.optimizer.hyperparams())
        self.step = 0
        self._step_graphs = None
        self._attach_scalers(fresh=True)
        self.per_network_loss = None

    # ---- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write model, optimizer state, step count and config to `path`, atomically (see `tinn.checkpoint`).

        Raises:
            CheckpointError: a state entry that a checkpoint cannot hold.
            OSError: the file cannot be written (an older checkpoint at `path` stays intact).
        """
        checkpoint.save(path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                               "trainer": {"step": self.step, **self.gradient_scaling_state()}},
                        metadata={"config": self.config})

    def load_checkpoint(self, path: str | os.PathLike, strict_config: bool = True) -> dict:
        """Restore model, optimizer and step from `path`, all or nothing (see `checkpoint.restore_trainer`).

        Args:
            path: a file written by `save_checkpoint`.
            strict_config: refuse a checkpoint saved with another config (False: load it if the shapes fit).

        Returns:
            The checkpoint's metadata (its `config` among them).

        Raises:
            CheckpointError: a missing, corrupt or incompatible file, a different config (when strict) or
                different shapes; the trainer is left as it was.
        """
        return checkpoint.restore_trainer(self, path, strict_config=strict_config)


class TrainerControls(LearningRateOf):
    """For objects built around a `trainer` (scene phases, viewer sources): its learning rate as their own."""

    trainer: Trainer

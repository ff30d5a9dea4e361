"""Composite: different optimizers for different parameter groups (e.g. encoding vs network).

    {"otype": "Composite", "nested": [
        {"params": "encoding", "otype": "Adam", "learning_rate": 1e-2, "epsilon": 1e-15},
        {"params": ["network"], "otype": "Adam", "learning_rate": 1e-3, "l2_reg": 1e-6}]}

Each entry of `nested` (a list, required) is a full optimizer config plus one optional selector:
- "params": a name or list of names; a parameter belongs to the entry if its name equals one of
  them or starts with it followed by "." (so "encoding" selects "encoding.params");
- else "n_params_to_optimize" (tcnn's key): the next unassigned parameters in `named_params`
  order whose element counts add up to exactly this number;
- else the entry takes the next single unassigned parameter in order.
Entries with "params" are resolved first; every parameter must end up in exactly one entry.

`learning_rate` is tcnn's `learning_rate_scale`: setting it multiplies every nested learning rate
by new/old scale (so the nested rates keep their ratios and schedules); it starts at the config's
"learning_rate_scale" (default 1). Per-network scales and inference weights go to the owning entry.
"""
from __future__ import annotations

import torch

from ..config import Section
from ..errors import ConfigError
from .base import Optimizer
from .registry import create_optimizer


def _matches(name: str, selector: str) -> bool:
    return name == selector or name.startswith(selector + ".")


class Composite(Optimizer):
    otype = "Composite"
    OPTIONS = ("nested", "learning_rate_scale")
    # Keys of each nested entry that select its parameters, read here besides the entry's own options.
    SELECTOR_KEYS = ("params", "n_params_to_optimize")

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg.path)
        entries = cfg.data.get("nested")
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{cfg.key('nested')} must be a non-empty list of optimizer configs, one per "
                              f"parameter group; got {type(entries).__name__ if entries is not None else 'nothing'}")
        sections = [Section(e, f"{cfg.key('nested')}[{i}]", extra_keys=self.SELECTOR_KEYS) for i, e in enumerate(entries)]
        groups = self._assign(sections)
        self.owner: dict[str, Optimizer] = {}
        self.nested: list[Optimizer] = []
        for i, (sec, names) in enumerate(zip(sections, groups)):
            child = create_optimizer(sec, [(n, self.params[n]) for n in names])
            self.nested.append(child)
            self.children.append((f"nested.{i}.", child))
            for n in names:
                self.owner[n] = child
        scale = cfg.number("learning_rate_scale", 1.0, lo=0.0)
        self.scalars["learning_rate_scale"] = 1.0
        for i, child in enumerate(self.nested):
            self.scalars[f"unscaled_learning_rate.{i}"] = child.learning_rate
        self._set_lr(scale)

    def _assign(self, sections: list[Section]) -> list[list[str]]:
        order = [n for n, _ in self.named_params]
        taken: dict[str, str] = {}
        groups: list[list[str] | None] = [None] * len(sections)

        def take(i: int, names: list[str]) -> None:
            for n in names:
                if n in taken:
                    raise ConfigError(f"{sections[i].path}: parameter {n!r} is already optimized by {taken[n]}")
                taken[n] = sections[i].path
            groups[i] = names

        for i, sec in enumerate(sections):
            if "params" in sec.data:
                sel = sec.data["params"]
                sel = [sel] if isinstance(sel, str) else sel
                if not isinstance(sel, list) or not sel or not all(isinstance(s, str) for s in sel):
                    raise ConfigError(f"{sec.key('params')}={sec.data['params']!r} must be a name or a list of names")
                names = [n for n in order if any(_matches(n, s) for s in sel)]
                if not names:
                    raise ConfigError(f"{sec.key('params')}={sel!r} matches no parameter; parameters: {order}")
                take(i, names)
        for i, sec in enumerate(sections):
            if groups[i] is not None:
                continue
            free = [n for n in order if n not in taken]
            if "n_params_to_optimize" in sec.data:
                want = sec.integer("n_params_to_optimize", lo=1)
                names, total = [], 0
                for n in free:
                    if total >= want:
                        break
                    names.append(n)
                    total += self.params[n].numel()
                if total != want:
                    raise ConfigError(f"{sec.key('n_params_to_optimize')}={want} does not end on a parameter "
                                      f"boundary (next free parameters: {[(n, self.params[n].numel()) for n in free]})")
            else:
                if not free:
                    raise ConfigError(f"{sec.path} has no parameter left to optimize; give it \"params\"")
                names = free[:1]
            take(i, names)
        left = [n for n in order if n not in taken]
        if left:
            raise ConfigError(f"{sections[0].path.rsplit('[', 1)[0]}: parameters {left} are not assigned to any entry; "
                              "add them to an entry's \"params\"")
        return groups

    @property
    def skips_on_device(self) -> bool:
        return all(child.skips_on_device for child in self.nested)

    def _apply(self, grads, skip=None) -> None:
        for child in self.nested:
            child._apply({n: grads.get(n) for n, _ in child.named_params}, skip)

    @property
    def step_count(self) -> int:
        return self.nested[0].step_count

    def device_step_count(self, device) -> tuple[int, torch.Tensor]:
        return self.nested[0].device_step_count(device)

    def _get_lr(self) -> float:
        return float(self.scalars["learning_rate_scale"])

    def _set_lr(self, value: float) -> None:
        old = self.scalars["learning_rate_scale"]
        for i, child in enumerate(self.nested):
            key = f"unscaled_learning_rate.{i}"
            if old > 0:  # re-read: nested schedules (ExponentialDecay) may have changed the rate
                self.scalars[key] = child.learning_rate / old
            child.learning_rate = self.scalars[key] * value
        self.scalars["learning_rate_scale"] = float(value)

    def set_lr_scale(self, name, scale) -> None:
        self._check_name(name)
        self.owner[name].set_lr_scale(name, scale)

    def lr_scale(self, name) -> torch.Tensor:
        self._check_name(name)
        return self.owner[name].lr_scale(name)

    def inference_params(self, name: str) -> torch.Tensor:
        self._check_name(name)
        return self.owner[name].inference_params(name)

    def hyperparams(self) -> dict:
        return {"otype": self.otype, "learning_rate_scale": self.learning_rate,
                "nested": [{"params": [n for n, _ in c.named_params], **c.hyperparams()} for c in self.nested]}

"""Novograd (Ginsburg et al. 2019, https://arxiv.org/abs/1905.11286) as in tcnn.

Per layer l: v_l = beta2 v_l + (1 - beta2) |g_l|^2 (a scalar); m = beta1 m + (1 - beta1) g / (sqrt(v_l) + eps);
w = decay(w) - lr m. On the first step beta1 = beta2 = 0 (exact initial values, as tcnn).

"Layer" = one weight matrix of one network: the blocks of `tinn_layer_shapes` (see
`base.layer_shapes`) or, without that attribute, each network's whole row of the tensor.
"""
from __future__ import annotations

import torch

from .. import chunks
from ..config import Section
from ..kernels import optimizers as optimizer_kernels
from .base import LeafOptimizer, layer_shapes, no_skip


class Novograd(LeafOptimizer):
    otype = "Novograd"
    OPTIONS = ("learning_rate", "beta1", "beta2", "epsilon", "relative_decay", "absolute_decay")
    SKIPS_ON_DEVICE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.beta1 = cfg.number("beta1", 0.9, lo=0.0, hi=0.999999)
        self.beta2 = cfg.number("beta2", 0.999, lo=0.0, hi=0.999999)
        self.epsilon = cfg.number("epsilon", 1e-8, lo=0.0, lo_open=True)
        self.relative_decay = cfg.number("relative_decay", 0.0, lo=0.0, hi=1.0)
        self.absolute_decay = cfg.number("absolute_decay", 0.0, lo=0.0)
        self.seg_start = {}
        for name, p in self.named_params:
            cols = p.numel() // self.rows[name]
            shapes = layer_shapes(name, p) or [(1, cols)]
            starts = [0]
            for a, b in shapes:
                starts.append(starts[-1] + a * b)
            self.seg_start[name] = torch.tensor(starts, dtype=torch.int32, device=p.device)
            self.new_state("m", name)
            self.state[f"v.{name}"] = torch.zeros(self.rows[name], len(shapes), dtype=torch.float32, device=p.device)

    def _update(self, name, w, g, lr_scale, skip=None):
        # The kernel tells the first step taken from the device count (a skipped first step is not one).
        step_now, pending = self.device_step_count(w.device)
        lr, lr_factor = self.rate_operands(1.0, w.device)
        args = (w, g, self.state[f"m.{name}"], self.state[f"v.{name}"], self.seg_start[name], lr_scale,
                no_skip(w.device) if skip is None else skip, pending, step_now, lr_factor,
                lr, self.beta1, self.beta2, self.epsilon, self.relative_decay, self.absolute_decay)
        chunks.launch_by_rows(optimizer_kernels.novograd_step, w.shape[0], w.shape[1], args, sliced=(0, 1, 2, 3, 5))

    def hyperparams(self) -> dict:
        return {"otype": self.otype, "learning_rate": self.learning_rate,
                **{k: getattr(self, k) for k in self.OPTIONS if k != "learning_rate"}}

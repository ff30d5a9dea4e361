"""Shampoo (Gupta, Koren, Singer 2018, https://arxiv.org/abs/1802.09568) with tcnn's practical choices.

For every weight matrix W (M x N, M, N <= 128) of every network, each step:
  g  = grad + l2_reg W
  m1 = EMA_beta1(g), m2 = EMA_beta2(g^2)                     (bias-corrected averages)
  u  = m1 / (sqrt(m2) + epsilon)                             the Adam direction
  L  = EMA_beta3(X X^T), R = EMA_beta3(X^T X)                X = u (cg_on_momentum, default) or g
  s  = EMA_beta_shampoo(L_root u R_root)                     L_root = ((1-identity) L + identity I)^(-1/4)
  W  = decay(W) - lr' s,  lr' = lr |u|_F / |s|_F             (frobenius_normalization: the step keeps
                                                              Adam's size, Shampoo only picks the direction)
Roots are recomputed on the first step and then every `root_update_interval` steps (default: tcnn's
schedule, every 10 steps for the first 100, then every 200) by a float64 eigendecomposition, which is
exact for these symmetric positive definite matrices (tcnn's f32 Newton iteration can fail to converge).
Parameters without matrices (no `tinn_layer_shapes`, not 3-D, or encoding tables) take the step
W = decay(W) - lr u. Unlike tcnn, the first step is already preconditioned and the state can be saved.

Memory: four M x M / N x N float32 matrices per layer and network, plus three moments per weight.
"""
from __future__ import annotations

import torch

from .. import chunks
from ..config import Section
from ..errors import ConfigError
from ..kernels import optimizers as optimizer_kernels
from .base import LeafOptimizer, is_matrix_param, layer_shapes

MAX_DIM = 128


def debiased(decay: float, step: int) -> tuple[float, float]:
    """(alpha, beta) with x_t = beta x_{t-1} + alpha g_t equal to the bias-corrected EMA; step counts from 0."""
    norm = 1.0 - decay ** (step + 1)
    return (1.0 - decay) / norm, decay * (1.0 - decay ** step) / norm


def inverse_fourth_root(stat: torch.Tensor, identity: float) -> torch.Tensor:
    """((1 - identity) sym(stat) + identity I)^(-1/4) for a batch of symmetric matrices, via float64 eigh."""
    a = stat.double()
    a = 0.5 * (a + a.transpose(-1, -2)) * (1.0 - identity)
    a = a + identity * torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    lam, vec = torch.linalg.eigh(a)
    lam = lam.clamp(min=identity * 1e-6)  # guards round-off only: a's eigenvalues are >= identity
    return ((vec * lam.pow(-0.25).unsqueeze(-2)) @ vec.transpose(-1, -2)).float()


class Shampoo(LeafOptimizer):
    otype = "Shampoo"
    OPTIONS = ("learning_rate", "beta1", "beta2", "beta3", "beta_shampoo", "epsilon", "identity", "l2_reg",
               "relative_decay", "absolute_decay", "cg_on_momentum", "frobenius_normalization",
               "root_update_interval")

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.beta1 = cfg.number("beta1", 0.9, lo=0.0, hi=0.999999)
        self.beta2 = cfg.number("beta2", 0.99, lo=0.0, hi=0.999999)
        self.beta3 = cfg.number("beta3", 0.9, lo=0.0, hi=0.999999)
        self.beta_shampoo = cfg.number("beta_shampoo", 0.9, lo=0.0, hi=0.999999)
        self.epsilon = cfg.number("epsilon", 1e-8, lo=0.0, lo_open=True)
        self.identity = cfg.number("identity", 0.01, lo=0.0, hi=1.0, lo_open=True)
        self.l2_reg = cfg.number("l2_reg", 1e-5, lo=0.0)
        self.relative_decay = cfg.number("relative_decay", 0.0, lo=0.0, hi=1.0)
        self.absolute_decay = cfg.number("absolute_decay", 0.0, lo=0.0)
        self.cg_on_momentum = cfg.boolean("cg_on_momentum", True)
        self.frobenius_normalization = cfg.boolean("frobenius_normalization", True)
        self.root_update_interval = cfg.integer("root_update_interval", 0, lo=0)  # 0: tcnn's schedule
        self.shapes: dict[str, list[tuple[int, int]]] = {}
        for name, p in self.named_params:
            shapes = layer_shapes(name, p) if is_matrix_param(name, p) else None
            if shapes and max(max(s) for s in shapes) > MAX_DIM:
                raise ConfigError(f"{cfg.path}.otype='Shampoo' supports weight matrices up to {MAX_DIM}x{MAX_DIM}; "
                                  f"parameter {name!r} has layers {shapes}")
            self.shapes[name] = shapes or []
            for kind in ("m1", "m2", "u") + (("sm",) if self.shapes[name] else ()):
                self.new_state(kind, name)
            rows = self.rows[name]
            for l, (a, b) in enumerate(self.shapes[name]):
                for kind, d in (("L", a), ("R", b), ("Lroot", a), ("Rroot", b)):
                    self.state[f"{kind}{l}.{name}"] = torch.zeros(rows, d, d, dtype=torch.float32, device=p.device)

    def _root_due(self) -> bool:
        t = self.step_count
        if t == 1:
            return True
        interval = self.root_update_interval or (10 if t < 100 else 200)
        return t % interval == 0

    def _update(self, name, w, g, lr_scale):
        t = self.step_count - 1  # steps taken before this one
        a1, b1 = debiased(self.beta1, t)
        a2, b2 = debiased(self.beta2, t)
        a3, b3 = debiased(self.beta3, t)
        a_s, b_s = debiased(self.beta_shampoo, t)
        st = self.state
        u = st[f"u.{name}"]
        rows, cols = w.shape
        # Every kernel here works row by row (network by network): tables past the chunk limit run in
        # row chunks (tinn/chunks.py), sized by the largest per-row block a kernel indexes.
        chunks.launch_by_rows(optimizer_kernels.shampoo_moments, rows, cols,
                              (w, g, st[f"m1.{name}"], st[f"m2.{name}"], u, self.l2_reg,
                                                             a1, b1, a2, b2, self.epsilon), sliced=range(5))
        lr = self.learning_rate
        if not self.shapes[name]:
            chunks.launch_by_rows(optimizer_kernels.direction_step, rows, cols,
                                  (w, u, lr_scale, lr, self.relative_decay, self.absolute_decay), sliced=range(3))
            return
        stat_src = u if self.cg_on_momentum else g
        due = self._root_due()
        off = 0
        for l, (a, b) in enumerate(self.shapes[name]):
            L, R = st[f"L{l}.{name}"], st[f"R{l}.{name}"]
            per_row = max(cols, a * a, b * b)
            chunks.launch_by_rows(optimizer_kernels.shampoo_gram, rows, per_row, (stat_src, off, a, b, L, R, a3, b3),
                                  sliced=(0, 4, 5))
            if due:
                st[f"Lroot{l}.{name}"].copy_(inverse_fourth_root(L, self.identity))
                st[f"Rroot{l}.{name}"].copy_(inverse_fourth_root(R, self.identity))
            tmp = torch.empty(w.shape[0], a, b, dtype=torch.float32, device=w.device)
            chunks.launch_by_rows(
                optimizer_kernels.shampoo_layer_step, rows, per_row,
                (w, u, st[f"sm.{name}"], off, a, b, st[f"Lroot{l}.{name}"], st[f"Rroot{l}.{name}"], tmp, lr_scale,
                 lr, a_s, b_s, self.relative_decay, self.absolute_decay, int(self.frobenius_normalization)),
                sliced=(0, 1, 2, 6, 7, 8, 9))
            off += a * b  # the layers tile the row (checked by layer_shapes)

    def hyperparams(self) -> dict:
        return {"otype": self.otype, "learning_rate": self.learning_rate,
                **{k: getattr(self, k) for k in self.OPTIONS if k != "learning_rate"}}

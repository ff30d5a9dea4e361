"""Plain SGD with L2 regularisation, as tcnn: w -= lr * (g + l2_reg * w)."""
from __future__ import annotations

from .. import chunks
from ..config import Section
from ..kernels import optimizers as optimizer_kernels
from .base import LeafOptimizer, no_skip


class SGD(LeafOptimizer):
    otype = "SGD"
    OPTIONS = ("learning_rate", "l2_reg")
    SKIPS_ON_DEVICE = True
    ELEMENTWISE = True

    def __init__(self, named_params, cfg: Section):
        super().__init__(named_params, cfg)
        self.l2_reg = cfg.number("l2_reg", 1e-8, lo=0.0)

    def _update(self, name, w, g, lr_scale, skip=None):
        skip = no_skip(w.device) if skip is None else skip
        lr, lr_factor = self.rate_operands(1.0, w.device)
        chunks.launch_by_rows(optimizer_kernels.sgd_step, w.shape[0], w.shape[1],
                              (w, g, lr_scale, skip, lr_factor, lr, self.l2_reg), sliced=range(3))

    def hyperparams(self) -> dict:
        return {"otype": self.otype, "learning_rate": self.learning_rate, "l2_reg": self.l2_reg}

"""Losses with tcnn's names, formulas and reduction (mean over every output element).

`loss.evaluate(pred, target)` returns the mean loss and its gradient in one kernel
launch, without a host sync, and optionally the mean loss of each network of an
array (for monitoring: the gradient is always that of the global mean, as in tcnn).
`loss(pred, target)` is the same computation as a differentiable torch op.

Formulas per element (p prediction, t target, q the optional `data_pdf`, default 1;
N = batch * dims):
    L2                  (p - t)^2 / q
    L1                  |p - t| / q
    RelativeL2          (p - t)^2 / (p^2 + 0.01) / q            denominator constant in the gradient
    RelativeL1          |p - t| / (|p| + 0.01) / q              denominator constant in the gradient
    MAPE                |p - t| / (|t| + 0.01) / q
    SMAPE               |p - t| / (0.5 (|t| + |p|) + 0.01) / q  denominator constant in the gradient
    RelativeL2Luminance (p - t)^2 / (L^2 + 0.01) / q,  L = luminance of the predicted RGB (dims >= 3;
                        with dims >= 6 the two RGB triples are summed first), constant in the gradient
    CrossEntropy        -t/q * log(p)                          p is a predicted PDF value (> 0)
    Variance            (t^2/q) (1/p - 1/q)                    importance-sampling variance (Neural
                                                               Importance Sampling), p a PDF value
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import checks, runtime
from .config import Section
from .errors import ConfigError, InputError
from .kernels import losses as loss_kernels

# otype -> kernel id. Names as in tcnn's documentation, matched case-insensitively (so "Mape" works too).
LOSSES: dict[str, int] = {
    "L2": loss_kernels.L2,
    "L1": loss_kernels.L1,
    "RelativeL2": loss_kernels.RELATIVE_L2,
    "RelativeL1": loss_kernels.RELATIVE_L1,
    "MAPE": loss_kernels.MAPE,
    "SMAPE": loss_kernels.SMAPE,
    "RelativeL2Luminance": loss_kernels.RELATIVE_L2_LUMINANCE,
    "CrossEntropy": loss_kernels.CROSS_ENTROPY,
    "Variance": loss_kernels.VARIANCE,
}
DEFAULT_LOSS = "RelativeL2"  # tcnn's default when `otype` is absent


@dataclass
class LossResult:
    value: torch.Tensor  # 0-d float32: mean over all elements
    grad: torch.Tensor  # like pred: d value / d pred
    per_network: torch.Tensor | None = None  # (n_networks,) mean loss of each network's samples (0 if none)


def checked_pair(kind: int, pred, target) -> tuple[torch.Tensor, torch.Tensor]:
    """pred and target validated for loss `kind`: float32 on tinn's device, the same shape, detached."""
    runtime.require_init()
    pred = checks.float_input("pred", pred.detach(), None)
    target = checks.float_input("target", target.detach(), pred.shape[1])
    if target.shape[0] != pred.shape[0]:
        raise InputError(f"target has batch size {target.shape[0]}; expected {pred.shape[0]} to match pred")
    if kind == loss_kernels.RELATIVE_L2_LUMINANCE and pred.shape[1] < 3:
        raise InputError(f"RelativeL2Luminance needs RGB predictions (dims >= 3), got {pred.shape[1]} dims")
    return pred, target


def _evaluate(kind: int, pred, target, data_pdf=None, net_ids=None, n_networks=None,
              mean_over: int | None = None) -> LossResult:
    pred, target = checked_pair(kind, pred, target)
    use_pdf = data_pdf is not None
    pdf = checks.float_input("data_pdf", data_pdf.detach(), pred.shape[1]) if use_pdf else pred
    if use_pdf and pdf.shape[0] != pred.shape[0]:
        raise InputError(f"data_pdf has batch size {pdf.shape[0]}; expected {pred.shape[0]} to match pred")
    batch, dims = pred.shape
    n_total = batch * dims
    grad = torch.empty_like(pred)
    elements = torch.empty_like(pred)
    if n_total:
        loss_kernels.loss_forward(kind, pred, target, pdf, int(use_pdf), 1.0 / (mean_over or n_total), grad,
                                  elements)
    # One reduction op (host time counts in a small step); an empty batch has loss 0, not mean()'s NaN.
    if not n_total:
        value = elements.new_zeros(())
    else:
        value = elements.mean() if mean_over is None else elements.sum() / mean_over
    per_network = None if n_networks is None else per_network_means(elements, net_ids, n_networks)
    return LossResult(value, grad, per_network)


def per_network_means(elements: torch.Tensor, net_ids, n_networks: int) -> torch.Tensor:
    """Mean of each network's (batch, dims) loss elements; 0 for a network without samples."""
    batch, dims = elements.shape
    ids = checks.net_ids(net_ids, batch, int(n_networks))
    sums = torch.zeros(int(n_networks), dtype=torch.float32, device=elements.device)
    counts = torch.zeros(int(n_networks), dtype=torch.int32, device=elements.device)
    if batch:
        loss_kernels.per_network_sums(elements.sum(1), ids, sums, counts)
    return torch.where(counts > 0, sums / (counts.clamp(min=1).float() * dims), torch.zeros_like(sums))


class _LossFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pred, target, data_pdf, kind, mean_over):
        res = _evaluate(kind, pred, target, data_pdf, mean_over=mean_over)
        ctx.save_for_backward(res.grad)
        return res.value

    @staticmethod
    def backward(ctx, dvalue):
        (grad,) = ctx.saved_tensors
        # Targets and pdfs get no gradient (tcnn does not provide one either).
        return grad * dvalue, None, None, None, None


class Loss:
    """A tcnn loss. Stateless apart from its type; see the module docstring for formulas.

    mean_over: the number of elements the mean divides by; None (default) for the batch's own (batch x dims).
    A part that evaluates pieces of a larger batch in different places (a sharded array computing each
    sample's loss where its network lives) sets it to the whole batch's count, so that the pieces' values and
    gradients add up to the whole batch's (`averaged_over`)."""

    def __init__(self, otype: str, mean_over: int | None = None):
        if otype not in LOSSES:
            raise ConfigError(f"unknown loss {otype!r}; allowed: {list(LOSSES)}")
        if mean_over is not None and (isinstance(mean_over, bool) or not isinstance(mean_over, int)
                                      or mean_over < 1):
            raise ConfigError(f"mean_over={mean_over!r}; allowed: None (the batch's element count) or a positive "
                              "integer")
        self.otype = otype
        self.kind = LOSSES[otype]
        self.mean_over = mean_over

    def averaged_over(self, n_elements: int) -> "Loss":
        """This loss with its mean taken over `n_elements` elements, whatever the batch it evaluates."""
        return Loss(self.otype, int(n_elements))

    def evaluate(self, pred: torch.Tensor, target: torch.Tensor, net_ids: torch.Tensor | None = None,
                 n_networks: int | None = None, data_pdf: torch.Tensor | None = None) -> LossResult:
        """Mean loss, its gradient w.r.t. `pred`, and per-network means if `n_networks` is given.

        `data_pdf` (like target) is tcnn's optional per-element sampling pdf.
        """
        return _evaluate(self.kind, pred, target, data_pdf, net_ids, n_networks, self.mean_over)

    def __call__(self, pred: torch.Tensor, target: torch.Tensor, data_pdf: torch.Tensor | None = None) -> torch.Tensor:
        """Differentiable mean loss (0-d tensor); gradients flow to `pred` only."""
        return _LossFn.apply(pred, target, data_pdf, self.kind, self.mean_over)

    def hyperparams(self) -> dict:
        return {"otype": self.otype}

    def __repr__(self) -> str:
        extra = "" if self.mean_over is None else f", mean_over={self.mean_over}"
        return f"Loss(otype={self.otype!r}{extra})"


def create_loss(config: dict | Section | None = None, path: str = "loss") -> Loss:
    """Build a loss from a tcnn config (`{"otype": "RelativeL2"}`); `otype` defaults to RelativeL2 like tcnn."""
    runtime.ensure_init()
    cfg = config if isinstance(config, Section) else Section(config or {}, path)
    otype = cfg.otype(list(LOSSES), default=DEFAULT_LOSS)
    cfg.expect_keys(("otype",), repr(otype))  # tcnn's losses have no other option
    return Loss(otype)


__all__ = ["Loss", "LossResult", "LOSSES", "create_loss"]

"""Optimizers and the factory that builds them from tcnn `optimizer` configs (nesting included).

    opt = create_optimizer({"otype": "EMA", "decay": 0.99,
                            "nested": {"otype": "Adam", "learning_rate": 1e-2}}, model.named_parameters())
    loss.backward(); opt.step()

Leaf optimizers: SGD, Adam, Novograd, Shampoo. Wrappers (take `"nested": {...}`): Average,
Batched, EMA, ExponentialDecay, Lookahead; Composite takes `"nested": [{...}, ...]`, one entry
per parameter group (see `composite.py`). `otype` is matched case-insensitively and defaults
to Adam, like tcnn.
"""
from __future__ import annotations

from .. import runtime
from ..config import Section, expect_options
from .base import Optimizer, is_matrix_param

# otype -> class taking (named_params, Section). Filled below, and by `register_optimizer`.
OPTIMIZERS: dict[str, type] = {}
DEFAULT_OPTIMIZER = "Adam"


def register_optimizer(otype: str, cls: type) -> None:
    if getattr(cls, "OPTIONS", None) is None:
        raise TypeError(f"{cls.__name__} must declare OPTIONS, the config keys it reads")
    OPTIMIZERS[otype] = cls


def create_optimizer(config: dict | Section | None, named_params, path: str = "optimizer") -> Optimizer:
    """Build an optimizer over `named_params` (an iterable of (name, nn.Parameter)) from a tcnn config."""
    runtime.ensure_init()
    cfg = config if isinstance(config, Section) else Section(config if config is not None else {}, path)
    otype = cfg.otype(list(OPTIMIZERS), default=DEFAULT_OPTIMIZER)
    expect_options(cfg, OPTIMIZERS[otype], otype)
    return OPTIMIZERS[otype](list(named_params), cfg)


def _register_builtins() -> None:
    from .adam import Adam
    from .composite import Composite
    from .novograd import Novograd
    from .sgd import SGD
    from .shampoo import Shampoo
    from .wrappers import EMA, Average, Batched, ExponentialDecay, Lookahead

    for cls in (Adam, SGD, Novograd, Shampoo, Average, Batched, Composite, EMA, ExponentialDecay, Lookahead):
        register_optimizer(cls.otype, cls)


_register_builtins()

__all__ = ["Optimizer", "OPTIMIZERS", "create_optimizer", "register_optimizer", "is_matrix_param"]

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

from .base import Optimizer, is_matrix_param
from .registry import DEFAULT_OPTIMIZER, OPTIMIZERS, create_optimizer, register_optimizer


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

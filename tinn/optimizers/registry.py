"""The optimizer registry (otype -> class) and the factory that builds one from a tcnn config.

Its own module so that the wrappers and Composite, which build their nested optimizers with the
factory, import it without importing the package that registers them."""
from __future__ import annotations

from .. import runtime
from ..config import Section, expect_options
from .base import Optimizer

# otype -> class taking (named_params, Section). Filled by the package with the built-in optimizers,
# and by `register_optimizer`.
OPTIMIZERS: dict[str, type] = {}
DEFAULT_OPTIMIZER = "Adam"


def register_optimizer(otype: str, cls: type) -> None:
    """Make `cls` buildable as `{"otype": otype, ...}` (it must declare OPTIONS, the keys it reads).

    Raises:
        TypeError: `cls` has no OPTIONS.
    """
    if getattr(cls, "OPTIONS", None) is None:
        raise TypeError(f"{cls.__name__} must declare OPTIONS, the config keys it reads")
    OPTIMIZERS[otype] = cls


def create_optimizer(config: dict | Section | None, named_params, path: str = "optimizer") -> Optimizer:
    """Build an optimizer from a tcnn-style `optimizer` config.

    Args:
        config: the config dict (`{"otype": "Adam", "learning_rate": 1e-2}`; nested wrappers included),
            a `Section`, or None for Adam with tcnn's defaults.
        named_params: an iterable of (name, nn.Parameter), e.g. `model.named_parameters()`.
        path: the config's key path, for error messages.

    Returns:
        The optimizer; call `step()` after `backward()`.

    Raises:
        ConfigError: an unknown otype or key, or a value out of range (the message names the key path).
    """
    runtime.ensure_init()
    cfg = config if isinstance(config, Section) else Section(config if config is not None else {}, path)
    otype = cfg.otype(list(OPTIMIZERS), default=DEFAULT_OPTIMIZER)
    expect_options(cfg, OPTIMIZERS[otype], otype)
    return OPTIMIZERS[otype](list(named_params), cfg)

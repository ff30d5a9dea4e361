"""The encoding registry (otype -> class) and the factory that builds one from a tcnn config.

Its own module so that Composite, which builds its nested encodings with the factory, imports it
without importing the package that registers the encodings."""
from __future__ import annotations

from ..config import Section, count, expect_options
from .base import Encoding

# otype -> class with `from_config(n_input_dims, Section, n_networks, seed)`. Filled by the package with
# the built-in encodings, and by `register_encoding`.
ENCODINGS: dict[str, type] = {}

DEFAULT_ENCODING = "OneBlob"  # tcnn's create_encoding default


def register_encoding(otype: str, cls: type) -> None:
    """Make `cls` buildable as `{"otype": otype, ...}` (a class with `from_config` and `OPTIONS`)."""
    ENCODINGS[otype] = cls


def create_encoding(n_input_dims: int, config: dict | Section | None, n_networks: int = 1, seed: int = 1337,
                    path: str = "encoding") -> Encoding:
    """Build an encoding from a tcnn-style `encoding` config.

    Args:
        n_input_dims: input width.
        config: the config dict (`{"otype": "HashGrid", ...}`) or a `Section`. Without `otype` it is a
            OneBlob, as in tcnn; None is tinn's pass-through Identity.
        n_networks: how many independent encodings (one per network of an array; grids get one table each).
        seed: initialisation seed.
        path: the config's key path, for error messages.

    Returns:
        The encoding, an `Encoding` (a torch module).

    Raises:
        ConfigError: an unknown otype or key, or a value out of range (the message names the key path).
    """
    cfg = config if isinstance(config, Section) else Section(config if config is not None else {"otype": "Identity"},
                                                             path)
    n_input_dims = count("n_input_dims", n_input_dims)
    otype = cfg.otype(list(ENCODINGS), DEFAULT_ENCODING)
    expect_options(cfg, ENCODINGS[otype], otype)
    return ENCODINGS[otype].from_config(n_input_dims, cfg, n_networks=n_networks, seed=seed)

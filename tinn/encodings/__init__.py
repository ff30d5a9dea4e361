"""Encodings and the factory that builds them from tcnn `encoding` configs."""
from __future__ import annotations

from ..config import Section, count, expect_options
from .base import Encoding
from .basic import FrequencyEncoding, IdentityEncoding
from .composite import CompositeEncoding
from .empty import EmptyEncoding
from .grid import GridEncoding
from .oneblob import OneBlobEncoding
from .presets import NRCEncoding
from .spherical_harmonics import SphericalHarmonicsEncoding
from .triangle_wave import TriangleWaveEncoding

# otype -> class with `from_config(n_input_dims, Section, n_networks, seed)`.
ENCODINGS: dict[str, type] = {
    "Identity": IdentityEncoding,
    "Frequency": FrequencyEncoding,
    "TriangleWave": TriangleWaveEncoding,
    "OneBlob": OneBlobEncoding,
    "SphericalHarmonics": SphericalHarmonicsEncoding,
    "Composite": CompositeEncoding,
    "Empty": EmptyEncoding,
    # tcnn's Neural Radiance Caching preset under both of its names.
    "NRC": NRCEncoding,
    "OneBlobFrequency": NRCEncoding,
    # One class; the otype only picks the default backing storage ("type"), as in tcnn.
    "Grid": GridEncoding,
    "HashGrid": GridEncoding,
    "DenseGrid": GridEncoding,
    "TiledGrid": GridEncoding,
}


DEFAULT_ENCODING = "OneBlob"  # tcnn's create_encoding default


def register_encoding(otype: str, cls: type) -> None:
    ENCODINGS[otype] = cls


def create_encoding(n_input_dims: int, config: dict | Section | None, n_networks: int = 1, seed: int = 1337,
                    path: str = "encoding") -> Encoding:
    """Build an encoding from a tcnn-style config dict (`{"otype": "Frequency", ...}`). A config without
    `otype` is a OneBlob, as in tcnn; no config at all (None) is tinn's pass-through Identity."""
    cfg = config if isinstance(config, Section) else Section(config if config is not None else {"otype": "Identity"},
                                                             path)
    n_input_dims = count("n_input_dims", n_input_dims)
    otype = cfg.otype(list(ENCODINGS), DEFAULT_ENCODING)
    expect_options(cfg, ENCODINGS[otype], otype)
    return ENCODINGS[otype].from_config(n_input_dims, cfg, n_networks=n_networks, seed=seed)


__all__ = ["Encoding", "ENCODINGS", "create_encoding", "register_encoding", "IdentityEncoding", "FrequencyEncoding",
           "TriangleWaveEncoding", "OneBlobEncoding", "SphericalHarmonicsEncoding", "CompositeEncoding",
           "GridEncoding", "EmptyEncoding", "NRCEncoding"]

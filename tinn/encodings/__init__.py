"""Encodings and the factory that builds them from tcnn `encoding` configs."""
from __future__ import annotations

from .base import Encoding
from .basic import FrequencyEncoding, IdentityEncoding
from .composite import CompositeEncoding
from .empty import EmptyEncoding
from .grid import GridEncoding
from .oneblob import OneBlobEncoding
from .presets import NRCEncoding
from .registry import DEFAULT_ENCODING, ENCODINGS, create_encoding, register_encoding
from .spherical_harmonics import SphericalHarmonicsEncoding
from .triangle_wave import TriangleWaveEncoding

# The built-in otypes.
for _otype, _cls in {
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
}.items():
    register_encoding(_otype, _cls)


__all__ = ["Encoding", "ENCODINGS", "create_encoding", "register_encoding", "IdentityEncoding", "FrequencyEncoding",
           "TriangleWaveEncoding", "OneBlobEncoding", "SphericalHarmonicsEncoding", "CompositeEncoding",
           "GridEncoding", "EmptyEncoding", "NRCEncoding"]

"""tcnn's composite presets: `NRC` and its alias `OneBlobFrequency`.

Neural Radiance Caching's input encoding (Müller et al. 2021), as tcnn registers it
(src/encoding.cu): TriangleWave over the first 3 dims (`n_frequencies`, default 12), OneBlob
over the next 5 (`n_bins`, default 4) and Identity over the rest, concatenated. It therefore
needs at least 8 input dims.
"""
from __future__ import annotations

from ..config import Section
from ..errors import ConfigError
from .composite import CompositeEncoding

def nrc_config(n_frequencies: int = 12, n_bins: int = 4) -> dict:
    return {"otype": "Composite", "nested": [
        {"n_dims_to_encode": 3, "otype": "TriangleWave", "n_frequencies": n_frequencies},
        {"n_dims_to_encode": 5, "otype": "OneBlob", "n_bins": n_bins},
        {"otype": "Identity"},
    ]}


class NRCEncoding(CompositeEncoding):
    otype = "NRC"
    OPTIONS = ("n_frequencies", "n_bins")

    @classmethod
    def from_config(cls, n_input_dims: int, cfg: Section, n_networks: int = 1, seed: int = 1337):
        if n_input_dims < 8:
            raise ConfigError(f"{cfg.path}.otype={cfg.data.get('otype')!r} encodes 3 spatial dims with TriangleWave "
                              f"and 5 with OneBlob, so it needs n_input_dims >= 8, got {n_input_dims}")
        n_bins = cfg.integer("n_bins", 4, lo=1)
        if n_bins & (n_bins - 1):  # checked here so the error names the key the user wrote
            raise ConfigError(f"{cfg.key('n_bins')}={n_bins} must be a power of two (as in tcnn); "
                              "allowed: 1, 2, 4, 8, ...")
        nested = nrc_config(cfg.integer("n_frequencies", 12, lo=1), n_bins)
        return super().from_config(n_input_dims, Section(nested, cfg.path), n_networks, seed)

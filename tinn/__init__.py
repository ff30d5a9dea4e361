"""tinn: train and query thousands of tiny neural networks at once, with Taichi kernels."""
from . import backend, checks, runtime, tcnn_layout
from .config import load_config
from .errors import CheckpointError, ConfigError, DeviceMemoryError, InputError, NotInitializedError, TinnError
from .runtime import init
from .settings import Settings

__version__ = "0.1.0"

# Names whose modules define kernels are imported on first use, so that `import tinn` does not yet
# bind the kernels to a backend and `tinn.init(backend=...)` can still choose (see tinn.backend).
_LAZY = {
    "Encoding": "encodings", "create_encoding": "encodings",
    "create_loss": "losses",
    "NetworkWithInputEncoding": "models",
    "Network": "networks", "NetworkArray": "networks",
    "create_optimizer": "optimizers",
    "Trainer": "trainer",
    "AutodiffPart": "autodiff", "AutodiffLoss": "autodiff",
    "Part": "part", "Context": "part", "SecondOrderError": "part", "SAMPLE_MAJOR": "part", "FEATURE_MAJOR": "part",
}


def __getattr__(attr: str):
    module = _LAZY.get(attr)
    if module is None:
        raise AttributeError(f"module 'tinn' has no attribute {attr!r}")
    import importlib
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[attr] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

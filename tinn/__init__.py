"""tinn: train and query thousands of tiny neural networks at once, with Taichi kernels.

The supported names are those in `__all__`; the subpackages (`tinn.encodings`, `tinn.networks`,
`tinn.optimizers`, `tinn.autodiff`, `tinn.distributed`, `tinn.scenes`, `tinn.viewer`, `tinn.torch`, ...)
are reachable as attributes after `import tinn` and list their own supported names in `__all__`.
"""
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


# Submodules reachable as `tinn.<name>` after `import tinn` (imported on first use, for the same reason).
_LAZY_MODULES = ("autodiff", "checkpoint", "distributed", "encodings", "losses", "models", "networks", "optimizers",
                 "part", "precompile", "render", "scenes", "tasks", "torch", "trainer", "viewer")

__all__ = [
    # set-up and configs
    "init", "load_config", "Settings", "__version__",
    # errors
    "TinnError", "ConfigError", "InputError", "CheckpointError", "DeviceMemoryError", "NotInitializedError",
    # models, training
    "NetworkWithInputEncoding", "NetworkArray", "Network", "Encoding", "create_encoding", "create_loss",
    "create_optimizer", "Trainer",
    # the part contract and parts written in Taichi
    "Part", "Context", "SecondOrderError", "SAMPLE_MAJOR", "FEATURE_MAJOR", "AutodiffPart", "AutodiffLoss",
]


def __getattr__(attr: str):
    import importlib

    if attr in _LAZY_MODULES:
        return importlib.import_module(f".{attr}", __name__)  # the import binds it in this namespace too
    module = _LAZY.get(attr)
    if module is None:
        raise AttributeError(f"module 'tinn' has no attribute {attr!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[attr] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))

"""tinn: train and query thousands of tiny neural networks at once, with Taichi kernels."""
from . import checks, runtime
from .config import load_config
from .encodings import Encoding, create_encoding
from .errors import CheckpointError, ConfigError, InputError, NotInitializedError, TinnError
from .runtime import init

__version__ = "0.1.0"

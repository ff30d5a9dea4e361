"""tinn: train and query thousands of tiny neural networks at once, with Taichi kernels."""
from . import checks, runtime
from .config import load_config
from .encodings import Encoding, create_encoding
from .errors import CheckpointError, ConfigError, InputError, NotInitializedError, TinnError
from .losses import create_loss
from .models import NetworkWithInputEncoding
from .networks import Network, NetworkArray
from .optimizers import create_optimizer
from .part import FEATURE_MAJOR, SAMPLE_MAJOR, Context, Part, SecondOrderError
from .runtime import init
from .settings import Settings
from .trainer import Trainer

__version__ = "0.1.0"

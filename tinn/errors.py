"""Exception types. Every message names the offending field and what is allowed."""


class TinnError(Exception):
    """Base class of all tinn errors."""


class ConfigError(TinnError, ValueError):
    """A configuration value is missing, unknown or out of range."""


class InputError(TinnError, ValueError):
    """A tensor handed to tinn has the wrong shape, dtype, device or contents."""


class NotInitializedError(TinnError, RuntimeError):
    """A kernel was used before `tinn.init()`."""


class CheckpointError(TinnError, ValueError):
    """A checkpoint file is unreadable or does not match the model."""


class DistributedError(TinnError, RuntimeError):
    """A collective between ranks failed: a rank exited, timed out, or ranks disagree on what to run."""


class DeviceMemoryError(TinnError, MemoryError):
    """A table would not fit the memory free on tinn's device (raised before allocating it)."""

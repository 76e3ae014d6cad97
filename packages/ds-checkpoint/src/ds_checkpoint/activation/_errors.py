"""Exception types of activation checkpointing."""


class ActivationCheckpointingConfigError(ValueError):
    """The ``activation_checkpointing`` settings are invalid; the message names the key to fix."""


class CheckpointBuffersExhaustedError(IndexError):
    """More ``checkpoint()`` calls than ``number_checkpoints`` contiguous buffers before a backward."""


class RNGTrackerError(Exception):
    """Misuse of the model-parallel RNG tracker (duplicate seed or name, unknown name)."""

"""Exception types of the training-state checkpoint half of ds_checkpoint."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class of every training-state checkpoint error."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint directory or one of its files does not exist; the message names the path."""


class CheckpointTagNotFoundError(CheckpointNotFoundError, AssertionError):
    """The tag asked for (or named by ``latest``) has no checkpoint directory.

    Also an ``AssertionError``, the class DeepSpeed raises there, so DeepSpeed-style ``except AssertionError``
    code keeps working; the message names the missing directory.
    """


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, tampered with or unreadable; the message names the file."""


class ClientStateError(CheckpointError, TypeError):
    """A value to be saved is neither JSON-safe nor a tensor; the message names its key path."""


class ShardFormatError(CheckpointError, ValueError):
    """An optimizer shard handed to ``save_state`` does not follow ``ds-flat-shard/1``."""


class TagValidationError(CheckpointError, AssertionError):
    """``checkpoint.tag_validation`` is ``Fail`` and the ranks passed different tags."""


class DeepSpeedImportError(CheckpointError):
    """A DeepSpeed checkpoint uses a layout or a pickled class this importer does not accept."""

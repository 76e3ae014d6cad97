"""DeepSpeed's ``deepspeed.checkpoint``: checkpoint helpers, mapped onto ds_checkpoint."""

from ds_checkpoint import DeepSpeedCheckpoint

__all__ = ["DeepSpeedCheckpoint"]

"""DeepSpeed's ``deepspeed.checkpoint``: checkpoint helpers, mapped onto ds_checkpoint."""

from ds_checkpoint import DeepSpeedCheckpoint

__all__ = ["DeepSpeedCheckpoint"]

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

"""DeepSpeed's ``deepspeed.runtime.activation_checkpointing.checkpointing``: forwards to
ds_engine.checkpointing (also ``deepspeed.checkpointing``), the one implementation in ds-checkpoint."""

from ds_engine import checkpointing as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

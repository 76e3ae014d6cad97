"""DeepSpeed's ``deepspeed.moe.utils``: forwards to ds_engine.moe.utils."""

from ds_engine.moe import utils as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.ops.lamb``: forwards to ds_engine.ops.lamb."""

from ds_engine.ops import lamb as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

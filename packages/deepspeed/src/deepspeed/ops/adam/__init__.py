"""DeepSpeed's ``deepspeed.ops.adam``: forwards to ds_engine.ops.adam."""

from ds_engine.ops import adam as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.ops.lion``: forwards to ds_engine.ops.lion."""

from ds_engine.ops import lion as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

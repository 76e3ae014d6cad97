"""DeepSpeed's ``deepspeed.ops.adagrad``: forwards to ds_engine.ops.adagrad."""

from ds_engine.ops import adagrad as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

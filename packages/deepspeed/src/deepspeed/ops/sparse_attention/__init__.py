"""DeepSpeed's ``deepspeed.ops.sparse_attention``: forwards to ds_engine.ops.sparse_attention."""

from ds_engine.ops import sparse_attention as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.utils.numa``: forwards to ds_engine.numa (range parsing; numactl binding fails at use)."""

from ds_engine import numa as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

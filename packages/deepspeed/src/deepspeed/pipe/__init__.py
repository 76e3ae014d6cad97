"""DeepSpeed's ``deepspeed.pipe``: pipeline parallelism is not in ds; every name fails at use, naming it (ds_engine.pipe)."""

from ds_engine import pipe as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

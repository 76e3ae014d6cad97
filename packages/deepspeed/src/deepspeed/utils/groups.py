"""DeepSpeed's ``deepspeed.utils.groups``: forwards to ds_engine.groups."""

from ds_engine import groups as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

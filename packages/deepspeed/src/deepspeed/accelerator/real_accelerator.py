"""DeepSpeed's ``deepspeed.accelerator.real_accelerator`` (``get_accelerator``, ``set_accelerator``): the
same functions as ``deepspeed.accelerator`` (ds_engine.accelerator)."""

from ds_engine import accelerator as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.accelerator`` (``get_accelerator()``): forwards to ds_engine.accelerator."""

from ds_engine import accelerator as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.accelerator.abstract_accelerator``: ``DeepSpeedAccelerator``, the base class of
the accelerator ``get_accelerator()`` returns (ds_engine.abstract_accelerator)."""

from ds_engine import abstract_accelerator as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

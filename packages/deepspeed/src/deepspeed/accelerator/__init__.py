"""DeepSpeed's ``deepspeed.accelerator`` (``get_accelerator()``): the names of ``real_accelerator``."""

from deepspeed._forward import forward
from deepspeed.accelerator import real_accelerator as _impl

__all__, __getattr__, __dir__ = forward(__name__, _impl)

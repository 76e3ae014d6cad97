"""DeepSpeed's ``deepspeed.utils.torch``: forwards to ds_engine.torch_utils."""

from ds_engine import torch_utils as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.moe``: mixture of experts is not in ds; every name fails at use (ds_engine.moe)."""

from ds_engine import moe as _impl

from deepspeed._forward import forward
from deepspeed.moe import layer as layer
from deepspeed.moe import utils as utils

__all__, __getattr__, __dir__ = forward(__name__, _impl, extra=["layer", "utils"])

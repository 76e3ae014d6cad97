"""DeepSpeed's ``deepspeed.moe`` (mixture of experts): not in ds; every name fails at use, naming it."""

from ds_engine.moe import layer
from ds_engine.moe.layer import MoE

__all__ = ["MoE", "layer"]

"""DeepSpeed's ``deepspeed.moe.experts`` (``Experts``): ds_moe's."""

from ds_moe import Experts

__all__ = ["Experts"]

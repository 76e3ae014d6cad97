"""DeepSpeed's ``deepspeed.moe.layer`` (``MoE``): ds_moe's layer; the engine gives it its expert groups."""

from ds_moe import MoE

__all__ = ["MoE"]

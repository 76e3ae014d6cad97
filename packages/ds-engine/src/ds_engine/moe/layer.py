"""``deepspeed.moe.layer.MoE``: not in ds; constructing it raises, naming the feature."""

from ds_engine._missing import missing_class

MoE = missing_class(
    __name__,
    "MoE",
    "mixture-of-experts layers with expert parallelism (deepspeed.moe)",
    "Write the experts as ordinary modules (each rank holds all of them) or use another MoE library.",
)

__all__ = ["MoE"]

"""DeepSpeed's ``deepspeed.runtime.engine``: ``DeepSpeedEngine`` is ds_engine's engine."""

from ds_engine import DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]

"""DeepSpeed's ``deepspeed.runtime.fp16.fused_optimizer``: ``FP16_Optimizer``, whose ``isinstance`` holds for
the optimizer ds builds for fp16 below ZeRO (ds_engine.optimizer_classes)."""

from ds_engine.optimizer_classes import FP16_Optimizer

__all__ = ["FP16_Optimizer"]

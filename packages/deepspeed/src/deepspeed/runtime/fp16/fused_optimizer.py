"""DeepSpeed's ``deepspeed.runtime.fp16.fused_optimizer``: ``FP16_Optimizer``, whose ``isinstance`` holds for
the optimizer ds builds for fp16 below ZeRO (deepspeed.runtime._optimizer_classes)."""

from deepspeed.runtime._optimizer_classes import FP16_Optimizer

__all__ = ["FP16_Optimizer"]

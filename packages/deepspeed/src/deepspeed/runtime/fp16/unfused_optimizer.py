"""DeepSpeed's ``deepspeed.runtime.fp16.unfused_optimizer``: ``FP16_UnfusedOptimizer``, whose ``isinstance``
holds for the optimizer ds builds for fp16/bf16 below ZeRO over an optimizer that is not a fused Adam
(deepspeed.runtime._optimizer_classes)."""

from deepspeed.runtime._optimizer_classes import FP16_UnfusedOptimizer

__all__ = ["FP16_UnfusedOptimizer"]

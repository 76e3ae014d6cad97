"""DeepSpeed's ``deepspeed.runtime.bf16_optimizer``: ``BF16_Optimizer``, whose ``isinstance`` holds for the
optimizer ds builds for bf16 below ZeRO (deepspeed.runtime._optimizer_classes)."""

from deepspeed.runtime._optimizer_classes import BF16_Optimizer

__all__ = ["BF16_Optimizer"]

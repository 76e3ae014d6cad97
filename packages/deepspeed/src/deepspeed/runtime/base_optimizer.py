"""DeepSpeed's ``deepspeed.runtime.base_optimizer``: ``DeepSpeedOptimizer`` (Lightning's isinstance check for
optimizer state) and ``ZeROOptimizer``, whose ``isinstance`` holds for the optimizers ds builds where
DeepSpeed's would (deepspeed.runtime._optimizer_classes)."""

from deepspeed.runtime._optimizer_classes import DeepSpeedOptimizer, ZeROOptimizer

__all__ = ["DeepSpeedOptimizer", "ZeROOptimizer"]

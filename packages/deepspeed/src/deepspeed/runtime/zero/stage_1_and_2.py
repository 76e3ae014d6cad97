"""DeepSpeed's ``deepspeed.runtime.zero.stage_1_and_2``: ``DeepSpeedZeroOptimizer`` is ds's ZeRO 1/2 optimizer
class itself (``ds_zero.ZeroOptimizer``), so ``isinstance(engine.optimizer, DeepSpeedZeroOptimizer)`` holds
where DeepSpeed's does. It is built by ``deepspeed.initialize`` from the config (its constructor is ds's)."""

from ds_zero import ZeroOptimizer as DeepSpeedZeroOptimizer

__all__ = ["DeepSpeedZeroOptimizer"]

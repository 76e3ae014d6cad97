"""DeepSpeed's ``deepspeed.runtime.zero.stage3``: ``DeepSpeedZeroOptimizer_Stage3`` is ds's stage-3 optimizer
class itself (``ds_zero.ZeroStage3Optimizer``), so ``isinstance`` holds where DeepSpeed's does; the module's
re-exports of ``partition_parameters`` (``Init``, ``GatheredParameters``, ...) forward there."""

from ds_zero import ZeroStage3Optimizer

from deepspeed._forward import forward
from deepspeed.runtime.zero import partition_parameters as _partition_parameters

DeepSpeedZeroOptimizer_Stage3 = ZeroStage3Optimizer

__all__, __getattr__, __dir__ = forward(
    __name__, _partition_parameters, extra=["DeepSpeedZeroOptimizer_Stage3"]
)

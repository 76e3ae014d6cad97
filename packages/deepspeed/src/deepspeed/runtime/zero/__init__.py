"""DeepSpeed's ``deepspeed.runtime.zero`` (also ``deepspeed.zero``): ``Init``, ``GatheredParameters`` and the rest.

Names come from ``partition_parameters`` first, then ds_engine.zero (the one implementation, over
ds_zero's stage 3).
"""

from ds_engine import zero as _impl

from deepspeed._forward import forward
from deepspeed.runtime.zero import config as config
from deepspeed.runtime.zero import partition_parameters
from deepspeed.runtime.zero.config import ZeroStageEnum as ZeroStageEnum
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus as ZeroParamStatus

__all__, __getattr__, __dir__ = forward(
    __name__,
    partition_parameters,
    _impl,
    extra=["ZeroParamStatus", "ZeroStageEnum", "config", "partition_parameters"],
)

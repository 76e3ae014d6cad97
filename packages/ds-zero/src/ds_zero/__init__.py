"""Data-parallel gradient reduction: ZeRO stages 0, 1, 2 and 3, buckets, overlap, CPU offload.

Stage 0 is :class:`GradientReducer` (bucketed all-reduce); stages 1 and 2 are :class:`ZeroOptimizer`;
stage 3 is :class:`ZeroStage3Optimizer` (package ``ds_zero.stage3``).
"""

from ._comm import AveragingRule
from ._errors import ZeroConfigError
from ._layout import GroupLayout
from ._protocol import LossScalerProtocol
from ._reducer import GradientReducer
from ._zero import SHARD_FORMAT, TESTED_OPTIMIZERS, MemoryReport, ZeroOptimizer, names_of
from .stage3 import CONFIG_FIELDS_STAGE3, GatheredParameters, PartitionOnConstruction, ZeroStage3Optimizer

__version__ = "0.1.0"
__all__ = [
    "AveragingRule",
    "CONFIG_FIELDS_STAGE3",
    "GatheredParameters",
    "PartitionOnConstruction",
    "ZeroStage3Optimizer",
    "GradientReducer",
    "GroupLayout",
    "LossScalerProtocol",
    "MemoryReport",
    "SHARD_FORMAT",
    "TESTED_OPTIMIZERS",
    "ZeroConfigError",
    "ZeroOptimizer",
    "__version__",
    "names_of",
]

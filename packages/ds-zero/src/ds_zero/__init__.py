"""Data-parallel gradient reduction: ZeRO stages 0, 1 and 2, buckets, overlap, CPU offload.

Stage 0 is :class:`GradientReducer` (bucketed all-reduce); stages 1 and 2 are :class:`ZeroOptimizer`.
"""

from ._errors import ZeroConfigError
from ._layout import GroupLayout
from ._protocol import LossScalerProtocol
from ._reducer import GradientReducer
from ._zero import SHARD_FORMAT, TESTED_OPTIMIZERS, MemoryReport, ZeroOptimizer, names_of

__version__ = "0.1.0"
__all__ = [
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

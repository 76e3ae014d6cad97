"""Data-parallel gradient reduction: ZeRO stages 0, 1 and 2, buckets, overlap, CPU offload.

Stage 0 is :class:`GradientReducer` (bucketed all-reduce); stages 1 and 2 are :class:`ZeroOptimizer`,
configured by :class:`ZeroOptions`. Both launch reductions through one :class:`BucketSchedule`.
"""

from ._config_fields import CONFIG_FIELDS
from ._errors import ZeroConfigError
from ._layout import GroupLayout
from ._memory import MemoryReport
from ._options import TESTED_OPTIMIZERS, ZeroOptions
from ._protocol import LossScalerProtocol
from ._reducer import GradientReducer
from ._schedule import BucketSchedule
from ._state import SHARD_FORMAT
from ._zero import ZeroOptimizer, names_of

__version__ = "0.1.0"
__all__ = [
    "BucketSchedule",
    "CONFIG_FIELDS",
    "GradientReducer",
    "GroupLayout",
    "LossScalerProtocol",
    "MemoryReport",
    "SHARD_FORMAT",
    "TESTED_OPTIMIZERS",
    "ZeroConfigError",
    "ZeroOptimizer",
    "ZeroOptions",
    "__version__",
    "names_of",
]

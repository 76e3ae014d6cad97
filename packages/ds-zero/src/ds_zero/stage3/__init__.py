"""ZeRO stage 3: parameters partitioned too, gathered per module for its forward and backward.

``ZeroStage3Optimizer`` is what the engine steps; ``PartitionOnConstruction`` (``zero.Init``) cuts a
model as it is built; ``GatheredParameters`` makes parameters whole for a block; ``set_leaf_modules`` makes a block (a
mixture-of-experts layer) gathered whole for its forward and backward.
"""

from ._construct import PartitionOnConstruction
from ._gathered import GatheredParameters
from ._heap import fix_mmap_threshold
from ._hooks import register_external_parameter, unregister_external_parameter
from ._leaf import get_leaf_modules, is_leaf, is_leaf_parameter, set_leaf_modules, unset_leaf_modules
from ._optimizer import ZeroStage3Optimizer
from ._options import CONFIG_FIELDS_STAGE3, Stage3Options
from ._status import ZeroParamStatus
from ._zeropp import HostGroups

__all__ = [
    "CONFIG_FIELDS_STAGE3",
    "GatheredParameters",
    "HostGroups",
    "PartitionOnConstruction",
    "Stage3Options",
    "ZeroParamStatus",
    "ZeroStage3Optimizer",
    "fix_mmap_threshold",
    "get_leaf_modules",
    "is_leaf",
    "is_leaf_parameter",
    "register_external_parameter",
    "unregister_external_parameter",
    "set_leaf_modules",
    "unset_leaf_modules",
]

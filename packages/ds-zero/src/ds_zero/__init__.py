"""Data-parallel gradient reduction: ZeRO stages 0, 1, 2 and 3, buckets, overlap, CPU offload.

Stage 0 is :class:`GradientReducer` (bucketed all-reduce); stages 1 and 2 are :class:`ZeroOptimizer`,
configured by :class:`ZeroOptions`. Both launch reductions through one :class:`BucketSchedule`.
Stage 3 is :class:`ZeroStage3Optimizer` (package ``ds_zero.stage3``). Both are :class:`ParamFragments`:
one parameter's fp32 master, optimizer state and reduced gradient, whole or this rank's piece, and
:func:`optimizer_of` finds the optimizer of a parameter. CPU collectives go over MPI under
mpirun (``_mpi.py``), else over shared memory when the ranks share a host (``_shm.py``), chosen in
``_transport.py``; :func:`mpi_collective_calls` and :func:`shm_collective_calls` count them.
"""

from ._aio import AioOptions, AsyncFileIO, IOHandle, aligned_empty
from ._comm import AveragingRule
from ._config_fields import CONFIG_FIELDS
from ._errors import OptimizerStateKeyError, StateDictMismatchError, ZeroAssertionError, ZeroConfigError
from ._fragments import ParamFragments, optimizer_of
from ._layout import GroupLayout
from ._memory import MemoryReport
from ._options import TESTED_OPTIMIZERS, ZeroOptions
from ._protocol import LossScalerProtocol
from ._reducer import GradientReducer
from ._schedule import BucketSchedule
from ._state import SHARD_FORMAT
from ._transport import calls as _transport_calls
from ._weak_hook import weak_post_accumulate_grad_hook
from ._zero import ZeroOptimizer, names_of
from .stage3 import CONFIG_FIELDS_STAGE3, GatheredParameters, PartitionOnConstruction, ZeroStage3Optimizer

__version__ = "0.1.0"


def mpi_collective_calls() -> int:
    """How many collectives MPI carried in this process (0 when it never qualified)."""
    return _transport_calls("mpi")


def shm_collective_calls() -> int:
    """How many collectives shared memory carried in this process (0 when it never qualified)."""
    return _transport_calls("shm")


__all__ = [
    "AioOptions",
    "AsyncFileIO",
    "AveragingRule",
    "BucketSchedule",
    "CONFIG_FIELDS",
    "CONFIG_FIELDS_STAGE3",
    "GatheredParameters",
    "GradientReducer",
    "GroupLayout",
    "IOHandle",
    "LossScalerProtocol",
    "MemoryReport",
    "OptimizerStateKeyError",
    "StateDictMismatchError",
    "ParamFragments",
    "PartitionOnConstruction",
    "SHARD_FORMAT",
    "TESTED_OPTIMIZERS",
    "ZeroAssertionError",
    "ZeroConfigError",
    "ZeroOptimizer",
    "ZeroOptions",
    "ZeroStage3Optimizer",
    "__version__",
    "aligned_empty",
    "mpi_collective_calls",
    "names_of",
    "optimizer_of",
    "shm_collective_calls",
    "weak_post_accumulate_grad_hook",
]

"""``deepspeed.utils.groups``: the process groups DeepSpeed code asks for, in ds's pure data parallelism.

ds trains data-parallel only (no tensor, pipeline, sequence or expert parallelism), so the data-parallel
group is the whole world and every model-parallel group is this rank alone: world size 1, rank 0. These
answer for a job without an ``mpu`` (Megatron-style model-parallel unit); a script that passes one to
``initialize`` asks it for its groups, as it must under DeepSpeed too.

DeepSpeed 0.19.8's public getters (``get_data_parallel_group`` and the rest) assert unless AutoTP or
``_create_model_parallel`` set its groups up; its private ones (``_get_data_parallel_world_size``, ...),
which its engine and published code call, answer from the world. ds's public and private getters both
answer, with the private ones' values (compared at 2 ranks with DeepSpeed's record,
packages/deepspeed/tests/test_comm_groups.py). The data-parallel group is torch's world group, on which
``get_global_rank`` works (DeepSpeed clones the world only because old torch refused that).
MoE's ``initialize`` fails naming the feature. The sequence getters answer from the job's topology when it has
a sequence axis (Ulysses), else as a data-parallel-only job.
"""

from __future__ import annotations

import atexit
from typing import Any

import torch.distributed as dist
from ds_engine import topology
from ds_engine._missing import missing_function

__all__ = [
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_src_rank",
    "get_tensor_model_parallel_world_size",
    "initialize",
]


def _initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_data_parallel_group() -> Any:
    """The world group (``torch.distributed.group.WORLD``); None before the process group exists."""
    return dist.group.WORLD if _initialized() else None


def get_data_parallel_world_size() -> int:
    return dist.get_world_size() if _initialized() else 1


def get_data_parallel_rank() -> int:
    return dist.get_rank() if _initialized() else 0


def get_model_parallel_group() -> Any:
    """This rank alone (ds has no model parallelism): a group of one, made on first use."""
    global _SELF_GROUP
    if not _initialized():
        return None
    if _SELF_GROUP is None:
        # new_group is collective: every rank creates every one-rank group, in the same order
        groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
        _SELF_GROUP = groups[dist.get_rank()]
        atexit.register(_forget_self_group)  # before ds-launch's teardown joins the groups' threads
    return _SELF_GROUP


def _forget_self_group() -> None:
    global _SELF_GROUP
    _SELF_GROUP = None


def get_model_parallel_world_size() -> int:
    return 1


def get_model_parallel_rank() -> int:
    return 0


def get_tensor_model_parallel_src_rank() -> int:
    """The global rank of the first rank of this rank's tensor-parallel group: this rank (groups of one)."""
    return get_data_parallel_rank()


_SELF_GROUP: Any = None
get_tensor_model_parallel_group = get_model_parallel_group
get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank

# DeepSpeed's private getters its engine and published code call (Megatron-DeepSpeed, transformers' and
# Accelerate's sequence parallelism): the same answers in a data-parallel-only job.
_get_data_parallel_group = get_data_parallel_group
_get_data_parallel_world_size = get_data_parallel_world_size
_get_data_parallel_rank = get_data_parallel_rank
_get_model_parallel_world_size = get_model_parallel_world_size
_get_expert_model_parallel_world_size = get_model_parallel_world_size


def _get_broadcast_src_rank() -> int:
    """The global rank that broadcasts to the data-parallel group: its first, rank 0."""
    return 0


def _sequence_topology() -> Any:
    """The job's topology when it has a sequence axis (Ulysses: sequence_parallel_size or parallel_state_sp)."""
    built = topology._CURRENT  # read, never build: building is collective and the engine's to do
    return built if built is not None and built.size("sequence") > 1 else None


def _get_sequence_parallel_group() -> Any:
    """The sequence-parallel group; without sequence parallelism DeepSpeed's KeyError."""
    topo = _sequence_topology()
    if topo is None:
        raise KeyError("No sequence parallel group found")
    return topo.group("sequence")


def _get_sequence_parallel_world_size() -> int:
    topo = _sequence_topology()
    return topo.size("sequence") if topo is not None else 1


def _get_sequence_parallel_rank() -> int:
    topo = _sequence_topology()
    return topo.coord("sequence") if topo is not None else 0


def _get_sequence_data_parallel_group() -> Any:
    """ZeRO's group under Ulysses: data x sequence (the data-parallel group without it)."""
    topo = _sequence_topology()
    return topo.group("data_sequence") if topo is not None else get_data_parallel_group()


def _get_sequence_data_parallel_world_size() -> int:
    topo = _sequence_topology()
    return topo.size("data_sequence") if topo is not None else get_data_parallel_world_size()


def _get_sequence_data_parallel_rank() -> int:
    topo = _sequence_topology()
    return topo.coord("data_sequence") if topo is not None else get_data_parallel_rank()


# DeepSpeed 0.19.8's groups.initialize is MoE's deprecated set-up (it raises, pointing to MoE(ep_size=...)):
# DeepSpeed-CIFAR's --moe path calls it. ds has no MoE, so it names that instead.
initialize = missing_function(
    __name__,
    "initialize",
    "mixture of experts / expert parallelism (deepspeed.moe, groups.initialize)",
    "Run without MoE (drop --moe): ds trains dense models, data parallel with ZeRO.",
)

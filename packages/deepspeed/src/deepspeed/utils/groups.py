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
MoE's ``initialize`` raises DeepSpeed 0.19.8's DeprecatedException; the expert-parallel getters
answer from the topology's ``expert_groups(ep_size)`` (DeepSpeed's names: ``"ep_size_<N>"``). The sequence getters answer from the job's topology when it has
a sequence axis (Ulysses), else as a data-parallel-only job.
"""

from __future__ import annotations

import atexit
from typing import Any

import torch.distributed as dist
from ds_engine import topology
from ds_engine.topology import get_topology

from deepspeed.utils.exceptions import DeprecatedException

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


# MoE: DeepSpeed's expert-group names and getters over the topology's expert groups
_made: dict[str, int] = {}  # expert group name -> ep size, in the order they were asked for


def _ep(group_name: str) -> int:
    if group_name not in _made:
        if not group_name.startswith("ep_size_"):
            raise KeyError(f"no expert group {group_name!r}; DeepSpeed names them 'ep_size_<N>'")
        _create_expert_and_data_parallel(int(group_name.removeprefix("ep_size_")))
    return _made[group_name]


def _create_expert_and_data_parallel(
    expert_parallel_size_: int, use_data_before_expert_parallel_: bool = False
) -> None:
    """Make the expert-parallel and expert-data-parallel groups of ``expert_parallel_size_`` (collective)."""
    if use_data_before_expert_parallel_:
        raise ValueError(
            "use_data_before_expert_parallel_: ds lays expert groups out as DeepSpeed's default only"
        )
    get_topology().expert_groups(expert_parallel_size_)
    _made.setdefault(f"ep_size_{expert_parallel_size_}", expert_parallel_size_)


def initialize(ep_size: int = 1, mpu: Any = None) -> None:
    """Retired in DeepSpeed 0.19.8, which raises this (DeepSpeed-CIFAR's ``--moe`` still calls it)."""
    raise DeprecatedException(
        "Please do not use the groups.initialize() API as it is deprecated. Instead, pass the desired ep_size "
        "to deepspeed.moe.layer.MoE(..,ep_size,..)"
    )


def _get_expert_parallel_group(group_name: str) -> Any:
    return get_topology().expert_groups(_ep(group_name))[0]


def _get_expert_data_parallel_group(group_name: str) -> Any:
    return get_topology().expert_groups(_ep(group_name))[1]


def _get_expert_parallel_group_dict() -> dict[str, Any]:
    return {name: get_topology().expert_groups(ep)[0] for name, ep in _made.items()}


def _get_expert_data_parallel_group_dict() -> dict[str, Any]:
    return {name: get_topology().expert_groups(ep)[1] for name, ep in _made.items()}


def _get_expert_parallel_world_size(group_name: str) -> int:
    return dist.get_world_size(_get_expert_parallel_group(group_name))


def _get_expert_parallel_rank(group_name: str) -> int:
    return dist.get_rank(_get_expert_parallel_group(group_name))


def _get_expert_parallel_src_rank(group_name: str) -> int:
    """The global rank of the first rank of this rank's expert-parallel group."""
    return dist.get_global_rank(_get_expert_parallel_group(group_name), 0)


def _get_expert_data_parallel_world_size(group_name: str) -> int:
    return dist.get_world_size(_get_expert_data_parallel_group(group_name))


def _get_expert_data_parallel_rank(group_name: str) -> int:
    return dist.get_rank(_get_expert_data_parallel_group(group_name))


def _get_max_expert_size_name() -> str:
    return max(_made, key=_made.__getitem__) if _made else "ep_size_1"


def _get_max_expert_size() -> int:
    return max(_made.values(), default=1)


def _get_expert_model_parallel_world_size() -> int:
    """Expert tensor parallelism is not in ds: 1."""
    return 1

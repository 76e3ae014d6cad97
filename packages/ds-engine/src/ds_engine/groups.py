"""``deepspeed.utils.groups``: the process groups DeepSpeed code asks for, in ds's pure data parallelism.

ds trains data-parallel only (no tensor, pipeline or expert parallelism), so the data-parallel group is
the whole world and every model-parallel group is this rank alone: world size 1, rank 0. These answer for
a job without an ``mpu`` (Megatron-style model-parallel unit); a script that passes one to ``initialize``
asks it for its groups, as it must under DeepSpeed too.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

__all__ = [
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_world_size",
    "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size",
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
    return _SELF_GROUP


def get_model_parallel_world_size() -> int:
    return 1


def get_model_parallel_rank() -> int:
    return 0


_SELF_GROUP: Any = None
get_tensor_model_parallel_group = get_model_parallel_group
get_tensor_model_parallel_world_size = get_model_parallel_world_size
get_tensor_model_parallel_rank = get_model_parallel_rank

"""DeepSpeed's ``deepspeed.comm``: torch.distributed under DeepSpeed's names.

``deepspeed.comm`` is a thin layer over ``torch.distributed`` whose collectives take the same arguments,
so the collectives here *are* torch's (no wrapper, no second implementation). What differs from torch:
``init_distributed`` joins the job however it was launched (``ds_launch``); ``get_rank`` /
``get_world_size`` answer 0 / 1 before initialisation, as DeepSpeed's do when no group exists;
``get_local_rank`` reads ``LOCAL_RANK``, which ``ds_launch`` keeps true under every launcher.
``P2POp`` is torch's (its ``op`` is ``isend`` / ``irecv``, which are torch's too), so a list of them goes
to torch's ``batch_isend_irecv`` as DeepSpeed's does to its own; ``all_gather_coalesced`` gathers a list
of tensors on every backend (DeepSpeed's needs torch's coalescing manager, which gloo lacks).
DeepSpeed's comms logger (``comms_logger`` in the config) is not provided: ``log_summary`` says so.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as _dist
from ds_engine import init_distributed
from ds_engine._missing import missing_function
from torch.distributed import (
    P2POp,
    ReduceOp,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    destroy_process_group,
    gather,
    get_backend,
    get_global_rank,
    irecv,
    is_available,
    isend,
    monitored_barrier,
    new_group,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
)

__all__ = [
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "TORCH_DISTRIBUTED_DEFAULT_PORT",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "allgather_fn",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "get_all_ranks_from_group",
    "get_backend",
    "get_global_rank",
    "get_local_rank",
    "get_rank",
    "get_world_group",
    "get_world_size",
    "inference_all_reduce",
    "init_distributed",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "log_summary",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_fn",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]

# DeepSpeed's default rendezvous port (deepspeed.constants re-exports it)
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500


class ProcessGroup:
    """DeepSpeed's ``deepspeed.comm.ProcessGroup``: a record of a group's id and ranks (``size`` is their
    count). It is not a torch group: collectives take torch's groups (``new_group``)."""

    def __init__(self, comm_id: Any, ranks: list[int] = []) -> None:  # noqa: B006 - DeepSpeed's default
        self.ranks = ranks
        self.comm_id = comm_id
        self.size = len(ranks)


class _AllWorks:
    """The handles of several asynchronous collectives, waited on as one."""

    def __init__(self, works: list[Any]) -> None:
        self.works = works

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def all_gather_coalesced(
    output_tensors: list[Any], input_tensors: list[Any], group: Any = None, async_op: bool = False
) -> Any:
    """Gather each ``input_tensors[i]`` of every rank into ``output_tensors[i]`` (rank-major, as
    ``all_gather_into_tensor``). Launched together; returns one handle for all with ``async_op``, else None."""
    if len(output_tensors) != len(input_tensors):
        raise ValueError(
            f"all_gather_coalesced: {len(output_tensors)} output tensors for {len(input_tensors)} inputs; "
            "pass one output (world size x the input's numel) per input"
        )
    works = [
        all_gather_into_tensor(out, inp, group=group, async_op=True)
        for out, inp in zip(output_tensors, input_tensors)
    ]
    handle = _AllWorks(works)
    if async_op:
        return handle
    handle.wait()
    return None


def is_initialized() -> bool:
    return _dist.is_available() and _dist.is_initialized()


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (the world by default); 0 before initialisation."""
    return _dist.get_rank(group) if is_initialized() else 0


def get_world_size(group: Any = None) -> int:
    """The size of ``group`` (the world by default); 1 before initialisation."""
    return _dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    """The rank on this machine (``LOCAL_RANK``, set by every launcher and by ``init_distributed``)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_world_group() -> Any:
    return _dist.group.WORLD


def get_all_ranks_from_group(group: Any = None) -> list[int]:
    return _dist.get_process_group_ranks(group or _dist.group.WORLD)


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> Any:
    """``torch.distributed.barrier``; a no-op before initialisation (a one-process run has no one to wait for)."""
    if not is_initialized():
        return None
    return _dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def allgather_fn(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Any:
    """DeepSpeed's name for ``all_gather_into_tensor``."""
    return all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


def reduce_scatter_fn(
    output_tensor: Any, tensor: Any, op: Any = ReduceOp.SUM, group: Any = None, async_op: bool = False
) -> Any:
    """DeepSpeed's name for ``reduce_scatter_tensor``."""
    return reduce_scatter_tensor(output_tensor, tensor, op=op, group=group, async_op=async_op)


def inference_all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None) -> Any:
    """DeepSpeed's inference all-reduce is an ordinary all-reduce here."""
    return all_reduce(tensor, op=op, group=group)


log_summary = missing_function(
    __name__,
    "log_summary",
    "DeepSpeed's comms logger (deepspeed.comm.log_summary)",
    'Remove the call (and keep "comms_logger": {"enabled": false} in the config).',
)

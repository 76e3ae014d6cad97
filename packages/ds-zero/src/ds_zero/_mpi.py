"""ZeRO's collectives over MPI (mpi4py), for CPU ranks that ``mpirun`` started.

Measured on a 2-core machine (docs/benchmarks.md, "ZeRO's collectives under mpirun": record and command), Open MPI's
shared-memory collectives move the lean GPT's 53 MB of fp32 gradients several times faster than gloo's
at 2 ranks: stage 0's all-reduce per gradient 15.6 ms against 76.0, the reduce to owners 13.2 against
27.7, the weight gather 6.5 against 19.7. When every rank of the group qualifies, the
collectives in ``_comm.py`` use this transport for CPU float32/float64 tensors; anything else (bf16 and
fp16, CUDA tensors) stays on torch.distributed; a group smaller than the world tries shared memory
(``_shm.py``) instead. ``_transport.py`` makes the choice.

A group qualifies when mpi4py is already imported (ds_launch imports it to discover ranks under mpirun;
this module never imports it), MPI runs with ``THREAD_MULTIPLE``, COMM_WORLD's ranks are
torch.distributed's, the group is the whole world, and every rank agrees (one small all-reduce over the
group when a reducer or optimizer is built, ``enable``).

Collectives run in order on one worker thread per process (``HostTransport``) over a duplicate of
COMM_WORLD; blocking MPI calls release the GIL.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from ._host_transport import HostTransport, Work

__all__ = ["MpiTransport", "enable"]


class MpiTransport(HostTransport):
    """Collectives on one MPI communicator."""

    kind = "mpi"
    dtypes = frozenset({torch.float32, torch.float64})

    def __init__(self, comm: Any, mpi: Any) -> None:
        self.comm = comm
        self.MPI = mpi
        super().__init__()

    def _buf(self, t: torch.Tensor) -> list:
        """An MPI buffer over ``t``'s memory (not a numpy view: that would pin the storage's size, and stage 3
        frees gathered parameters by resizing their storage to zero)."""
        nbytes = t.numel() * t.element_size()
        return [self.MPI.buffer.fromaddress(t.data_ptr(), nbytes), _MPI_TYPES[t.dtype](self.MPI)]

    def all_reduce(self, tensors: Sequence[torch.Tensor]) -> Work:
        """Sum each tensor across ranks in place."""
        MPI, comm = self.MPI, self.comm
        return self.submit(
            [(t, partial(comm.Allreduce, MPI.IN_PLACE, self._buf(t), op=MPI.SUM)) for t in tensors]
        )

    def reduce(self, pieces: Sequence[tuple[torch.Tensor, int]], rank: int) -> Work:
        """Sum each ``(tensor, root)`` across ranks into ``root``'s tensor (the others' stay as they were)."""
        MPI, comm = self.MPI, self.comm
        return self.submit(
            [
                (
                    t,
                    partial(comm.Reduce, MPI.IN_PLACE, self._buf(t), op=MPI.SUM, root=root)
                    if root == rank
                    else partial(comm.Reduce, self._buf(t), None, op=MPI.SUM, root=root),
                )
                for t, root in pieces
            ]
        )

    def broadcast(self, pieces: Sequence[tuple[torch.Tensor, int]]) -> Work:
        """Fill each ``(tensor, root)`` on every rank with ``root``'s tensor."""
        return self.submit([(t, partial(self.comm.Bcast, self._buf(t), root=root)) for t, root in pieces])

    def all_gather(self, span: torch.Tensor) -> Work:
        """``span`` is ``world`` equal parts, rank r's part filled on rank r: fill every part everywhere."""
        return self.submit([(span, partial(self.comm.Allgather, self.MPI.IN_PLACE, self._buf(span)))])


_MPI_TYPES = {torch.float32: lambda mpi: mpi.FLOAT, torch.float64: lambda mpi: mpi.DOUBLE}
_comm_world: list[MpiTransport] = []  # the one transport over a duplicate of COMM_WORLD, made once


def _local_reason(group: dist.ProcessGroup | None) -> str | None:
    """Why this rank cannot use MPI for ``group`` (None when it can)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return "mpi4py is not imported (ranks were not discovered through mpirun)"
    if not mpi.Is_initialized() or mpi.Is_finalized():
        return "MPI is not initialized"
    if mpi.Query_thread() != mpi.THREAD_MULTIPLE:
        return "MPI does not run with THREAD_MULTIPLE"
    world = mpi.COMM_WORLD
    if world.Get_size() != dist.get_world_size() or world.Get_rank() != dist.get_rank():
        return "MPI's COMM_WORLD is not torch.distributed's world"
    if group is not None and dist.get_process_group_ranks(group) != list(range(dist.get_world_size())):
        return "the group is not the whole world in rank order"  # MPI addresses COMM_WORLD's ranks
    return None


def enable(group: dist.ProcessGroup | None, agree: Callable[[bool, Any], bool]) -> MpiTransport | str:
    """The MPI transport for ``group`` when every rank qualifies (``agree`` is the group's vote), else why
    not, as this rank sees it."""
    if dist.get_world_size(group) != dist.get_world_size():
        return "the group is not the whole world"  # the same on every rank: no need to ask the others
    reason = _local_reason(group)
    if not agree(reason is None, group):
        return reason or "this rank qualifies, another does not"
    if not _comm_world:
        mpi = sys.modules["mpi4py.MPI"]
        _comm_world.append(MpiTransport(mpi.COMM_WORLD.Dup(), mpi))
    return _comm_world[0]

"""ZeRO's collectives over MPI (mpi4py), for CPU ranks that ``mpirun`` started.

Measured on this 2-core machine (tools/bench_zero_mpi.py, docs/benchmarks/ds-zero.md), Open MPI's
shared-memory collectives move the lean GPT's 53 MB of fp32 gradients several times faster than gloo's
at 2 ranks: stage 0's all-reduce per gradient 15.6 ms against 76.0, the reduce to owners 13.2 against
27.7, the weight gather 6.5 against 19.7. When every rank of the group qualifies, the
collectives in ``_comm.py`` use this transport for CPU float32/float64 tensors; anything else (bf16 and
fp16, CUDA tensors, a group smaller than the world) stays on torch.distributed.

A group qualifies when mpi4py is already imported (ds_launch imports it to discover ranks under mpirun;
this module never imports it), MPI runs with ``THREAD_MULTIPLE``, COMM_WORLD's ranks are
torch.distributed's, the group is the whole world, ``DS_ZERO_COLLECTIVES`` is not ``torch``, and every rank
agrees (one small all-reduce over the group when a reducer or optimizer is built, ``enable``).

Collectives run in order on one worker thread per process over a duplicate of COMM_WORLD (blocking MPI
calls release the GIL), so a launch returns at once, as ``async_op=True`` does, and every rank issues the
same MPI calls in the same order (the callers launch in a fixed order on every rank, as gloo needs too).
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ENV", "MpiTransport", "calls", "enable", "transport"]

ENV = "DS_ZERO_COLLECTIVES"  # "auto" (default): MPI where it qualifies; "torch": torch.distributed only
logger = logging.getLogger("ds_zero")


class Work:
    """What a launch returns: ``wait()`` blocks until the collective finished, re-raising its error."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

    def wait(self) -> bool:
        self._done.wait()
        if self._error is not None:
            raise RuntimeError(f"an MPI collective of ds-zero failed: {self._error}") from self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()


class MpiTransport:
    """Collectives on one MPI communicator, run in launch order by one worker thread."""

    def __init__(self, comm: Any, mpi: Any) -> None:
        self.comm = comm
        self.MPI = mpi
        self.calls = 0  # collectives run (tests read it to see that this transport carried the data)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ds-zero-mpi", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:  # each batch runs in its own frame, so no tensor outlives its collective here
            self._run_one(*self._queue.get())

    def _run_one(self, calls: list[tuple[torch.Tensor, Callable[[], None]]], work: Work) -> None:
        try:
            for _tensor, call in calls:
                call()
                self.calls += 1
        except BaseException as exc:  # handed to the waiter, never lost in the thread
            work._error = exc
        work._done.set()

    def submit(self, calls: Sequence[tuple[torch.Tensor, Callable[[], None]]]) -> Work:
        """Run each ``(tensor, call)`` in order after everything launched before; returns their one ``Work``.
        The tensor rides along so that its memory lives until the call has run."""
        work = Work()
        self._queue.put((list(calls), work))
        return work

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


_transports: dict[int, tuple[Any, MpiTransport]] = {}  # id(group object) -> (the group, its transport)
_comm_world: list[MpiTransport] = []  # the one transport over a duplicate of COMM_WORLD, made once


def _group_object(group: dist.ProcessGroup | None) -> Any:
    return dist.group.WORLD if group is None else group


def _local_reason(group: dist.ProcessGroup | None) -> str | None:
    """Why this rank cannot use MPI for ``group`` (None when it can)."""
    if os.environ.get(ENV, "auto") == "torch":
        return f"{ENV}=torch"
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


def enable(group: dist.ProcessGroup | None) -> MpiTransport | None:
    """Decide, together with the group's other ranks, whether ``group``'s collectives go over MPI.

    A collective over ``group``: every rank calls it at the same point (when a reducer or optimizer is
    built). Returns the transport, or None when any rank does not qualify.
    """
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return None
    key = id(_group_object(group))
    if key in _transports:
        return _transports[key][1]
    if dist.get_world_size(group) != dist.get_world_size():
        return None  # the same on every rank: no need to ask the others
    reason = _local_reason(group)
    ok = torch.tensor([0 if reason else 1], dtype=torch.int32)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
    if not ok.item():
        return None
    if not _comm_world:
        mpi = sys.modules["mpi4py.MPI"]
        _comm_world.append(MpiTransport(mpi.COMM_WORLD.Dup(), mpi))
        if dist.get_rank() == 0:
            logger.info(
                "ds-zero: CPU fp32/fp64 collectives go over MPI (mpi4py); set %s=torch for torch.distributed",
                ENV,
            )
    _transports[key] = (_group_object(group), _comm_world[0])
    return _comm_world[0]


def transport(group: dist.ProcessGroup | None, *tensors: torch.Tensor) -> MpiTransport | None:
    """The MPI transport that carries ``tensors`` over ``group``, or None (torch.distributed carries them):
    MPI takes contiguous CPU float32/float64 tensors."""
    if not _transports or not all(
        t.device.type == "cpu" and t.dtype in _MPI_TYPES and t.is_contiguous() for t in tensors
    ):
        return None
    entry = _transports.get(id(_group_object(group)))
    return entry[1] if entry is not None and entry[0] is _group_object(group) else None


def calls() -> int:
    """How many collectives MPI has carried in this process (0 when it never qualified)."""
    return _comm_world[0].calls if _comm_world else 0

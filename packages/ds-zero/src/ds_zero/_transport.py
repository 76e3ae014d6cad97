"""Host transports: faster carriers than gloo for ZeRO's CPU collectives, chosen once per process group.

Two exist, tried in this order when a reducer or optimizer is built (``enable``, a collective over the
group):

- **MPI** (``_mpi.py``): under ``mpirun``, when ds_launch found the ranks through mpi4py;
- **shared memory** (``_shm.py``): when every rank of a gloo group can map one file in ``/dev/shm``, i.e.
  the ranks share a host (ds-launch's and torchrun's single-node jobs).

Anything a transport does not take (CUDA tensors, dtypes it has no sum for, a non-contiguous tensor)
stays on torch.distributed. ``DS_ZERO_COLLECTIVES`` picks: ``auto`` (default: MPI, else shared memory),
``mpi`` or ``shm`` (that one only), ``torch`` (torch.distributed only).

A transport runs its collectives in launch order on one worker thread per process, so a launch returns at
once, as ``async_op=True`` does; the callers launch in the same order on every rank, as gloo needs too.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ENV", "HostTransport", "Work", "calls", "enable", "transport"]

ENV = "DS_ZERO_COLLECTIVES"
CHOICES = ("auto", "mpi", "shm", "torch")
logger = logging.getLogger("ds_zero")


class Work:
    """What a launch returns: ``wait()`` blocks until the collective finished, re-raising its error."""

    def __init__(self, kind: str) -> None:
        self._kind = kind
        self._done = threading.Event()
        self._error: BaseException | None = None

    def wait(self) -> bool:
        self._done.wait()
        if self._error is not None:
            raise RuntimeError(f"a {self._kind} collective of ds-zero failed: {self._error}") from self._error
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()


class HostTransport:
    """Runs submitted calls in order on one worker thread. Subclasses provide the four collectives:
    ``all_reduce(tensors)``, ``reduce(pieces, rank)``, ``broadcast(pieces)``, ``all_gather(span)``."""

    kind = "host"
    dtypes: frozenset[torch.dtype] = frozenset()

    def __init__(self) -> None:
        self.calls = 0  # collectives run (tests read it to see that this transport carried the data)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"ds-zero-{self.kind}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._run_one(*self._queue.get())

    def _run_one(self, calls: list[tuple[Any, Callable[[], None]]], work: Work) -> None:
        """Each call's tensors (and the closure that holds them) are dropped as soon as it has run, and
        all of them before the waiter is woken: none outlives its collective, not even by a thread switch."""
        calls.reverse()  # popped from the end, in launch order
        entry = None  # (tensors, call): held while the call runs, which may read the tensors' memory only
        try:
            while calls:
                entry = calls.pop()
                entry[1]()
                self.calls += 1
                entry = None
        except BaseException as exc:  # handed to the waiter, never lost in the thread
            work._error = exc
        entry = None
        calls.clear()
        work._done.set()

    def submit(self, calls: Sequence[tuple[Any, Callable[[], None]]]) -> Work:
        """Run each ``(tensors, call)`` in order after everything launched before; returns their one
        ``Work``. The tensors ride along so that their memory lives until the call has run."""
        work = Work(self.kind)
        self._queue.put((list(calls), work))
        return work

    def carries(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.dtype in self.dtypes and t.is_contiguous()


_transports: dict[int, tuple[Any, HostTransport]] = {}  # id(group object) -> (the group, its transport)
_calls: dict[str, list[HostTransport]] = {"mpi": [], "shm": []}


def _group_object(group: dist.ProcessGroup | None) -> Any:
    return dist.group.WORLD if group is None else group


def _agree(ok: bool, group: dist.ProcessGroup | None) -> bool:
    """True when ``ok`` holds on every rank of ``group`` (a collective)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def choice() -> str:
    value = os.environ.get(ENV, "auto")
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r} is not one of {', '.join(CHOICES)}; unset it for 'auto'")
    return value


def enable(group: dist.ProcessGroup | None) -> HostTransport | None:
    """Decide, together with the group's other ranks, which host transport carries ``group``'s
    collectives. A collective over ``group``: every rank calls it at the same point (when a reducer or
    optimizer is built). Returns the transport, or None (torch.distributed carries everything)."""
    from . import _mpi, _shm

    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return None
    key = id(_group_object(group))
    if key in _transports and _transports[key][0] is _group_object(group):
        return _transports[key][1]
    wanted = choice()
    made: HostTransport | str = "not tried"
    if wanted in ("auto", "mpi"):
        made = _mpi.enable(group, _agree)
    if isinstance(made, str) and wanted in ("auto", "shm"):
        made = _shm.enable(group, _agree)
    if isinstance(made, str):
        if wanted in ("mpi", "shm"):  # asked for by name: say why it was not taken, rank by rank
            _warn_not_taken(wanted, made, group)
        return None
    _transports[key] = (_group_object(group), made)
    if made not in _calls[made.kind]:
        _calls[made.kind].append(made)
        if dist.get_rank() == 0:
            logger.info(
                "ds-zero: CPU collectives of a %d-rank group go over %s; set %s=torch for torch.distributed",
                dist.get_world_size(group),
                "MPI (mpi4py)" if made.kind == "mpi" else "shared memory",
                ENV,
            )
    return made


def _warn_not_taken(wanted: str, mine: str, group: dist.ProcessGroup | None) -> None:
    """The group's rank 0 logs every rank's reason (a collective: each rank that failed to agree calls it)."""
    world = dist.get_world_size(group)
    reasons: list[Any] = [None] * world
    dist.all_gather_object(reasons, mine, group=group)
    if dist.get_rank(group) == 0:
        logger.warning(
            "ds-zero: %s=%s was not taken for a %d-rank group; torch.distributed carries its collectives. %s",
            ENV, wanted, world, "; ".join(f"rank {r}: {why}" for r, why in enumerate(reasons)),
        )  # fmt: skip


def transport(group: dist.ProcessGroup | None, *tensors: torch.Tensor) -> HostTransport | None:
    """The host transport that carries ``tensors`` over ``group``, or None (torch.distributed carries them)."""
    if not _transports or not tensors:
        return None
    entry = _transports.get(id(_group_object(group)))
    if entry is None or entry[0] is not _group_object(group):
        return None
    t = entry[1]
    return t if all(t.carries(x) for x in tensors) else None


def calls(kind: str = "mpi") -> int:
    """How many collectives the ``kind`` transport (``mpi`` or ``shm``) carried in this process."""
    return sum(t.calls for t in _calls[kind])

"""What every host transport is: a worker thread that runs submitted collectives in launch order.

``_mpi.MpiTransport`` and ``_shm.ShmTransport`` subclass ``HostTransport``; ``_transport`` chooses one per
process group.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["HostTransport", "Work"]


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

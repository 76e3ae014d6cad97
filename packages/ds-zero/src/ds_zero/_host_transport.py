"""What every host transport is: a worker thread that runs submitted collectives in launch order.

``_mpi.MpiTransport`` and ``_shm.ShmTransport`` subclass ``HostTransport``; ``_transport`` chooses one per
process group.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
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


# How long a process's exit waits for collectives it launched but nobody waited for (a prefetch, the gather
# after the last step): every rank launched the same ones, so they finish unless a peer is gone.
EXIT_DRAIN_S = 10.0


class HostTransport:
    """Runs submitted calls in order on one worker thread. Subclasses provide the four collectives:
    ``all_reduce(tensors)``, ``reduce(pieces, rank)``, ``broadcast(pieces)``, ``all_gather(span)``.

    At interpreter exit the worker is drained and stopped (``close``): Python kills a daemon thread that is
    still inside torch's C++ code at finalization, and the unwinding aborts the process ("terminate called
    without an active exception", exit -6) after the script itself succeeded."""

    kind = "host"
    dtypes: frozenset[torch.dtype] = frozenset()

    def __init__(self) -> None:
        self.calls = 0  # collectives run (tests read it to see that this transport carried the data)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"ds-zero-{self.kind}", daemon=True)
        self._thread.start()
        self._closed = False
        atexit.register(_close_at_exit, weakref.ref(self))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            self._run_one(*item)

    def close(self, timeout_s: float = EXIT_DRAIN_S) -> None:
        """Let the collectives already launched finish (at most ``timeout_s``), then stop the worker."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        self._thread.join(timeout_s)

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
        if self._closed:
            raise RuntimeError(f"ds-zero's {self.kind} transport is closed (the process is exiting)")
        work = Work(self.kind)
        self._queue.put((list(calls), work))
        return work

    def carries(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.dtype in self.dtypes and t.is_contiguous()


def _close_at_exit(ref: weakref.ref[HostTransport]) -> None:
    transport = ref()
    if transport is not None:
        transport.close()

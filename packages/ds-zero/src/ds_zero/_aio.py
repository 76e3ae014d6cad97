"""Asynchronous file I/O for NVMe offload: a thread pool over ``os.preadv`` / ``os.pwritev``.

Chosen by measurement (``tools/bench/bench_nvme_io.py``, docs/benchmarks.md "NVMe offload: the I/O layer"):
``preadv``/``pwritev`` release the GIL, so a few worker threads keep the disk busy while Python computes;
with ``O_DIRECT`` (used for every request whose buffer address, file offset and length are aligned to
``ALIGN``; the swap layouts keep them so) the bytes bypass the page cache, so swapped state does not come
back as cache pages in the process's memory cgroup.

The ``aio`` section's keys act here, as their DeepSpeed names say:

* ``block_size``: a request is cut into chunks of at most this many bytes; one chunk is one system call.
* ``thread_count`` (``intra_op_parallelism`` when that is the one set) and ``queue_depth``: DeepSpeed's
  op runs ``thread_count`` threads, each keeping up to ``queue_depth`` chunks submitted to the kernel
  (libaio). A ``preadv``/``pwritev`` is synchronous, so one chunk in the kernel is one blocked thread:
  the pool has ``thread_count x queue_depth`` threads, and that many chunks are inside a system call at
  once at most (``IOStats.peak_in_flight``), the device-side concurrency DeepSpeed's op reaches.
  Submission never blocks the caller: chunks beyond that wait in the pool's queue (``IOStats.peak_queued``),
  so a caller that issues reads ahead goes on computing while they are served.
* ``single_submit``: a request's chunks are submitted one at a time (the next after the previous one
  completed) instead of all at once across the workers.
* ``overlap_events``: submission returns at once and the caller waits on the handle later; when false,
  every read and write is complete when it returns (no I/O overlaps the caller's work).

``IOStats`` counts what happened (bytes, calls, chunks queued and inside a system call at once, the
threads that did I/O): the tests observe each key through it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

__all__ = [
    "ALIGN",
    "AioOptions",
    "AsyncFileIO",
    "IOHandle",
    "IOStats",
    "aligned_down",
    "aligned_empty",
    "aligned_spans",
    "aligned_up",
    "pinned",
]

ALIGN = (
    4096  # O_DIRECT alignment of buffer address, file offset and length (the page size covers 512-byte disks)
)


def aligned_up(n: int) -> int:
    """``n`` rounded up to a multiple of ``ALIGN``."""
    return -(-n // ALIGN) * ALIGN


def aligned_down(n: int) -> int:
    """``n`` rounded down to a multiple of ``ALIGN``."""
    return n // ALIGN * ALIGN


def aligned_spans(start: int, end: int) -> list[tuple[int, int]]:
    """``[start, end)`` cut at ``ALIGN`` boundaries: the unaligned head, the aligned middle (a request that
    can go through ``O_DIRECT`` where the buffer's address is aligned alike) and the unaligned tail, the
    empty ones left out."""
    mid0, mid1 = aligned_up(start), aligned_down(end)
    cuts = [start, end] if mid0 >= mid1 else [start, mid0, mid1, end]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]


@dataclass(frozen=True)
class AioOptions:
    """The ``aio`` section (DeepSpeed's names and defaults)."""

    block_size: int = 1 << 20
    queue_depth: int = 8
    thread_count: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    direct: bool = True  # O_DIRECT where the file system and the request allow it


@dataclass
class IOStats:
    """What the I/O layer did (observed by the tests and the benchmarks)."""

    bytes_read: int = 0
    bytes_written: int = 0
    calls: int = 0  # system calls (chunks)
    direct_calls: int = 0  # of which through O_DIRECT
    queued: int = 0  # chunks submitted and not completed
    peak_queued: int = 0
    in_flight: int = 0  # chunks inside a system call
    peak_in_flight: int = 0
    threads: set[int] = field(default_factory=set)


def aligned_empty(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` (rounded up to ``ALIGN``) whose address is ``ALIGN``-aligned."""
    n = aligned_up(nbytes)
    raw = torch.empty(n + ALIGN, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % ALIGN
    return raw[skip : skip + n]


_unpinned_said: set[str] = set()


def pinned(buf: torch.Tensor, key: str) -> torch.Tensor:
    """``buf`` page-locked (a buffer's ``pin_memory``), or ``buf`` itself where torch cannot page-lock
    without an accelerator, said once per config key ``key``."""
    try:
        return buf.pin_memory()
    except RuntimeError:
        if key not in _unpinned_said:
            _unpinned_said.add(key)
            logging.getLogger("ds_zero").info("%s: no accelerator here, swap buffers stay pageable", key)
        return buf


class IOHandle:
    """The completion of one read or write: ``wait()`` returns when every chunk is done (or raises)."""

    def __init__(self, futures: list[Future], on_done: Callable[[], None] | None = None) -> None:
        self._futures = futures
        self._on_done = on_done

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def wait(self) -> None:
        error = None
        for f in self._futures:
            exc = f.exception()
            error = error or exc
        self._futures = []
        if self._on_done is not None:
            self._on_done()
            self._on_done = None
        if error is not None:
            raise error


class _File:
    """One swap file opened twice: through O_DIRECT (aligned requests) and buffered (the rest)."""

    def __init__(self, path: str, direct: bool) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        self.dfd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self.dfd = os.open(path, os.O_RDWR | os.O_DIRECT)
            except OSError:  # tmpfs and some network file systems refuse O_DIRECT
                self.dfd = -1

    def close(self) -> None:
        for fd in (self.fd, self.dfd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.dfd = -1


class AsyncFileIO:
    """Reads and writes between tensors and files through a pool of ``thread_count x queue_depth`` workers."""

    def __init__(self, options: AioOptions | None = None) -> None:
        self.options = o = options or AioOptions()
        for name in ("block_size", "queue_depth", "thread_count"):
            if getattr(o, name) < 1:
                raise ValueError(f"aio.{name} must be >= 1, got {getattr(o, name)}")
        self.stats = IOStats()
        self.workers = o.thread_count * o.queue_depth
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="ds-aio")
        self._lock = threading.Lock()
        self._files: dict[str, _File] = {}
        self.trace: list[tuple[str, float, float, int]] | None = None  # set to a list: (kind, t0, t1, bytes)

    # ------------------------------------------------------------------ files
    def open(self, path: str) -> _File:
        f = self._files.get(path)
        if f is None:
            f = self._files[path] = _File(path, self.options.direct)
        return f

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for f in self._files.values():
            f.close()
        self._files.clear()

    # ------------------------------------------------------------------ requests
    def read(self, path: str, offset: int, out: torch.Tensor) -> IOHandle:
        """Fill the contiguous CPU tensor ``out`` with the bytes of ``path`` at ``offset``."""
        return self._submit(path, offset, out, write=False)

    def write(self, path: str, offset: int, src: torch.Tensor) -> IOHandle:
        """Write the bytes of the contiguous CPU tensor ``src`` into ``path`` at ``offset``."""
        return self._submit(path, offset, src, write=True)

    def _submit(self, path: str, offset: int, t: torch.Tensor, *, write: bool) -> IOHandle:
        if not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError("aio transfers need a contiguous CPU tensor")
        f = self.open(path)
        buf = t.view(-1).view(torch.uint8).numpy() if t.numel() else None
        if buf is None:
            return IOHandle([])
        o = self.options
        chunks = [(lo, min(lo + o.block_size, buf.nbytes)) for lo in range(0, buf.nbytes, o.block_size)]
        if o.single_submit:  # one request in flight at a time: its chunks in order on one worker
            self._queue(len(chunks))
            futures = [self._pool.submit(self._run_serial, f, buf, offset, chunks, write)]
        else:
            self._queue(len(chunks))
            futures = [self._pool.submit(self._io, f, buf[lo:hi], offset + lo, write) for lo, hi in chunks]
        handle = IOHandle(futures)
        if not o.overlap_events:
            handle.wait()
        return handle

    def _queue(self, n: int) -> None:
        with self._lock:
            self.stats.queued += n
            self.stats.peak_queued = max(self.stats.peak_queued, self.stats.queued)

    def _run_serial(self, f: _File, buf, offset: int, chunks, write: bool) -> None:
        for i, (lo, hi) in enumerate(chunks):
            try:
                self._io(f, buf[lo:hi], offset + lo, write)
            except BaseException:
                with self._lock:
                    self.stats.queued -= len(chunks) - i - 1  # the chunks after a failed one never run
                raise

    def _io(self, f: _File, piece, offset: int, write: bool) -> None:
        n = piece.nbytes
        aligned = f.dfd >= 0 and offset % ALIGN == 0 and n % ALIGN == 0 and piece.ctypes.data % ALIGN == 0
        fd = f.dfd if aligned else f.fd
        with self._lock:
            self.stats.in_flight += 1
            self.stats.peak_in_flight = max(self.stats.peak_in_flight, self.stats.in_flight)
        t0 = time.perf_counter()
        done = 0
        try:
            while done < n:
                view = piece[done:]
                got = os.pwritev(fd, [view], offset + done) if write else os.preadv(fd, [view], offset + done)
                if got == 0:
                    if write:
                        raise OSError(errno.ENOSPC, f"no space left writing {n - done} bytes", f.path)
                    raise OSError(errno.EIO, f"{f.path}: short read at offset {offset + done}")
                done += got
        finally:
            with self._lock:
                s = self.stats
                s.in_flight -= 1
                s.queued -= 1
                if done == n:
                    s.calls += 1
                    s.direct_calls += aligned
                    s.threads.add(threading.get_ident())
                    if self.trace is not None:
                        self.trace.append(("write" if write else "read", t0, time.perf_counter(), n))
                    if write:
                        s.bytes_written += n
                    else:
                        s.bytes_read += n

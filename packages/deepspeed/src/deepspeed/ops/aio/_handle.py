"""DeepSpeed's async I/O op (``AsyncIOBuilder().load()``) over ds's own file I/O (``ds_zero.AsyncFileIO``).

DeepSpeed compiles a C++ op over libaio; ``load()`` returns a module with ``aio_handle``, ``aio_read``,
``aio_write`` and ``deepspeed_memcpy``. ds gives the same names and return values over its thread pool of
``os.preadv``/``os.pwritev`` (O_DIRECT where aligned), compared with DeepSpeed 0.19.8 on real files
(tools/fixtures/make_deepspeed_aio_fixtures.py). Where DeepSpeed fails silently or aborts the process, ds raises:

* a write whose size is not a multiple of 512 bytes: DeepSpeed returns 1 and leaves the file empty (its
  O_DIRECT write fails unseen); ds writes the bytes (through the buffered descriptor).
* a read past the end of the file, or ``wait()`` with nothing pending: DeepSpeed aborts the process (a
  failed C++ assertion); ds raises ``ValueError`` / ``RuntimeError`` naming the file or the call.

Kept as DeepSpeed returns them: ``-1`` for a read of a missing file and for a request whose byte count
``intra_op_parallelism`` does not divide (DeepSpeed's "not divisible by intra op parallelism").
``overlap_events`` is recorded (``get_overlap_events``) and has no other effect: how libaio interleaves
submission and completion inside a thread has no counterpart in a thread pool of blocking calls.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import torch
from ds_zero import AioOptions, AsyncFileIO, IOHandle, aligned_empty

__all__ = ["aio_handle", "aio_read", "aio_write", "deepspeed_memcpy", "load"]

logger = logging.getLogger("ds_engine")

_SECTOR = 512  # DeepSpeed's O_DIRECT_ALIGNMENT: get_alignment() is intra_op_parallelism x this


class aio_handle:  # noqa: N801  (DeepSpeed's name)
    """DeepSpeed's ``aio_handle(block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)``."""

    def __init__(
        self,
        block_size: int = 1024 * 1024,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
    ) -> None:
        self._args = (block_size, queue_depth, single_submit, overlap_events, intra_op_parallelism)
        self.io = AsyncFileIO(
            AioOptions(
                block_size=block_size,
                queue_depth=queue_depth,
                thread_count=intra_op_parallelism,
                single_submit=single_submit,
            )
        )
        self._pending: list[tuple[IOHandle, tuple | None]] = []
        self._locked: set[int] = set()

    # ------------------------------------------------------------------ getters
    def get_block_size(self) -> int:
        return self._args[0]

    def get_queue_depth(self) -> int:
        return self._args[1]

    def get_single_submit(self) -> bool:
        return self._args[2]

    def get_overlap_events(self) -> bool:
        return self._args[3]

    def get_intra_op_parallelism(self) -> int:
        return self._args[4]

    def get_alignment(self) -> int:
        return self._args[4] * _SECTOR

    # ------------------------------------------------------------------ requests
    def _check(self, buffer: torch.Tensor, filename: str, file_offset: int, read: bool) -> bool:
        nbytes = buffer.numel() * buffer.element_size()
        if nbytes % self._args[4]:
            logger.error(
                "aio_handle: %s of %d bytes is not divisible by intra_op_parallelism %d: returns -1 "
                "(as DeepSpeed's op does)",
                "read" if read else "write",
                nbytes,
                self._args[4],
            )
            return False
        if read:
            if not os.path.isfile(filename):
                logger.error(
                    "aio_handle: cannot read %s: no such file (returns -1, as DeepSpeed's op does)", filename
                )
                return False
            size = os.path.getsize(filename)
            if file_offset + nbytes > size:
                raise ValueError(
                    f"aio_handle read of {filename}: file_offset + buffer bytes = {file_offset + nbytes} > file "
                    f"bytes {size} (DeepSpeed 0.19.8 aborts the process here); read at most {size - file_offset} "
                    "bytes from that offset"
                )
        return True

    def _submit(self, buffer: torch.Tensor, filename: str, file_offset: int, read: bool, validate: bool):
        if not self._check(buffer, filename, file_offset, read):
            return None
        flat = buffer.detach().reshape(-1) if buffer.is_contiguous() else None
        if flat is None:
            raise ValueError("aio_handle transfers need a contiguous CPU tensor")
        handle = (
            self.io.read(filename, file_offset, flat) if read else self.io.write(filename, file_offset, flat)
        )
        return handle, ((filename, file_offset, flat) if validate else None)

    def _finish(self, handle: IOHandle, check: tuple | None) -> None:
        handle.wait()
        if check is not None:  # validate: the bytes in the file equal the buffer's
            filename, offset, flat = check
            data = flat.view(torch.uint8).numpy().tobytes()
            with open(filename, "rb") as f:
                f.seek(offset)
                if f.read(len(data)) != data:
                    raise OSError(
                        f"aio_handle validate: {filename} at offset {offset} differs from the buffer"
                    )

    def _sync(self, buffer, filename, file_offset, read, validate=False) -> int:
        op = self._submit(buffer, filename, file_offset, read, validate)
        if op is None:
            return -1
        self._finish(*op)
        return 1

    def _async(self, buffer, filename, file_offset, read, validate=False) -> int:
        op = self._submit(buffer, filename, file_offset, read, validate)
        if op is None:
            return -1
        self._pending.append(op)
        return 0

    def read(self, buffer: torch.Tensor, filename: str, validate: bool, file_offset: int = 0) -> int:
        return self._sync(buffer, filename, file_offset, True, validate)

    def write(self, buffer: torch.Tensor, filename: str, validate: bool, file_offset: int = 0) -> int:
        return self._sync(buffer, filename, file_offset, False, validate)

    def pread(self, buffer, filename, validate, async_, file_offset=0) -> int:  # DeepSpeed's 4th is "async"
        return (self._async if async_ else self._sync)(buffer, filename, file_offset, True, validate)

    def pwrite(self, buffer, filename, validate, async_, file_offset=0) -> int:
        return (self._async if async_ else self._sync)(buffer, filename, file_offset, False, validate)

    def sync_pread(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        return self._sync(buffer, filename, file_offset, True)

    def sync_pwrite(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        return self._sync(buffer, filename, file_offset, False)

    def async_pread(self, buffer: torch.Tensor, filename: str, file_offset: int = 0) -> int:
        return self._async(buffer, filename, file_offset, True)

    def async_pwrite(self, buffer: torch.Tensor, filename, file_offset: int = 0) -> int:
        if isinstance(filename, int):  # DeepSpeed's overload on an open file descriptor
            filename = os.readlink(f"/proc/self/fd/{filename}")
        return self._async(buffer, filename, file_offset, False)

    def wait(self) -> int:
        """Wait for every pending asynchronous request; returns how many there were."""
        if not self._pending:
            raise RuntimeError(
                "aio_handle.wait() with no pending asynchronous request (DeepSpeed 0.19.8 aborts the process "
                "here); call it once after the async_pread/async_pwrite calls it completes"
            )
        pending, self._pending = self._pending, []
        for handle, check in pending:
            self._finish(handle, check)
        return len(pending)

    # ------------------------------------------------------------------ buffers
    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """A CPU tensor of ``num_elem`` elements of ``example_tensor``'s dtype, aligned for O_DIRECT (page-
        locked where an accelerator makes that possible in torch)."""
        nbytes = num_elem * example_tensor.element_size()
        t = aligned_empty(nbytes)[:nbytes].view(example_tensor.dtype)
        self._locked.add(t.data_ptr())
        return t

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> bool:
        if tensor.data_ptr() not in self._locked:
            return False
        self._locked.discard(tensor.data_ptr())
        return True

    def is_pinned(self, buffer: torch.Tensor) -> bool:
        return buffer.is_pinned() or buffer.data_ptr() in self._locked


def _one_shot(
    buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, read
) -> int:
    handle = aio_handle(block_size, queue_depth, single_submit, overlap_events)
    try:
        return 0 if handle._sync(buffer, filename, 0, read, validate) == 1 else -1
    finally:
        handle.io.close()


def aio_read(buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate) -> int:
    """DeepSpeed's ``aio_read``: one synchronous read; 0 on success, -1 when the file cannot be opened."""
    return _one_shot(buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, True)


def aio_write(buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate) -> int:
    """DeepSpeed's ``aio_write``: one synchronous write; 0 on success."""
    return _one_shot(
        buffer, filename, block_size, queue_depth, single_submit, overlap_events, validate, False
    )


def deepspeed_memcpy(dest: torch.Tensor, src: torch.Tensor) -> int:
    """DeepSpeed's ``deepspeed_memcpy``: ``dest`` gets ``src``'s values; 0."""
    with torch.no_grad():
        dest.copy_(src)
    return 0


def load() -> SimpleNamespace:
    """What ``AsyncIOBuilder().load()`` returns: the op's four names."""
    return SimpleNamespace(
        aio_handle=aio_handle, aio_read=aio_read, aio_write=aio_write, deepspeed_memcpy=deepspeed_memcpy
    )

"""NVMe offload of the parameters (``offload_param.device: "nvme"``): ZeRO-3 weight partitions in files.

A rank's partition of a param group is cut into *pieces*: the elements of each parameter this rank owns.
In model order, pieces stay in CPU memory while their total stays within ``max_in_cpu`` elements (as in
DeepSpeed 0.19.8, whose flat CPU buffer holds that many elements); every later piece lives in
``nvme_path/ds_swap_params/rank{r:05d}/g{g}.param.bin``, each at its own ``ALIGN``-aligned offset, and moves
through at most ``buffer_count`` buffers of ``buffer_size`` elements (page-locked with ``pin_memory``
where an accelerator allows it). A gather reads the piece into a buffer, copies it into the parameter's
full tensor (or the collective's buffer) and gives the buffer back (``piece``, ``done``). The fetch
schedule reads the next modules' pieces ahead of use into the free buffers (``read_ahead``, by the
recorded module order), so their I/O overlaps the current module's compute; a read issued ahead is
given up when its buffer is needed now (``steals``) or when the micro-step ends (``drop_ahead``).
Writes (a step's new weights, a load, a ``GatheredParameters`` modification) also go through a buffer,
so every transfer is aligned and through ``O_DIRECT``. The step's writes are left in flight
(``write_range(..., wait=False)``): each keeps its buffer (the source of the bytes) until it is waited for,
so the disk writes one sub-group's new weights while the optimizer steps the next ones; ``flush`` waits
for them all at the end of the step. A sub-group that covers only part of a piece leaves the piece *dirty*
(its buffer holds the new values of the ranges written so far) and its write is issued once the step's
sub-groups have covered the whole piece, so each piece is written once per step and never read back for
it; a dirty piece needed before then (a gather, a buffer, the step's end) has its other ranges read from
the file first (``_settle``). A piece with a write in flight is never read from its file nor written again
before that write is done: ``piece`` waits for it and hands out its buffer (which holds the newest
values), and a later write of the piece starts from that buffer, so writes of one piece reach the file in
order.

The files are scratch like the optimizer's (``_swap.SwapFolder``): emptied when a run starts, never read
as state; checkpoints stay ds's portable format.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .._aio import AsyncFileIO, IOHandle, aligned_empty, aligned_spans, aligned_up, pinned
from .._errors import ZeroConfigError
from ._grad_parts import mark_written, split_written
from ._swap import SwapFolder

__all__ = ["ParamSwap"]

logger = logging.getLogger("ds_zero")


class _State(enum.Enum):
    """Where a piece kept in a file is, as far as its buffer goes (a piece in CPU memory stays ``FILE``)."""

    FILE = "in its file only, no buffer"
    READ_AHEAD = "a read issued ahead of use into its buffer, not used yet"
    IN_USE = "handed out by piece(), until done()"
    DIRTY = "partly updated by the step in its buffer; its write not issued yet"
    WRITING = "its write in flight from its buffer (the newest values), not waited for yet"


@dataclass(eq=False)
class _Piece:
    key: Hashable
    name: str
    group: int
    lo: int  # [lo, hi): elements of the rank's partition of the group
    hi: int
    offset: int = -1  # bytes into the group's file; -1 while the piece is kept in CPU memory
    cpu: torch.Tensor | None = None
    # its swap state: one of _State, with what that state holds (the buffer; the I/O in flight; the ranges
    # of the buffer holding new values while DIRTY)
    state: _State = _State.FILE
    buf: torch.Tensor | None = None
    handle: IOHandle | None = None
    covered: list[tuple[int, int]] = field(default_factory=list)

    @property
    def numel(self) -> int:
        return self.hi - self.lo


class ParamSwap:
    """This rank's parameter pieces: ``max_in_cpu`` elements of them in memory, the rest in files."""

    def __init__(
        self,
        folder: SwapFolder,
        io: AsyncFileIO,
        *,
        buffer_count: int,
        buffer_size: int,
        max_in_cpu: int,
        pin_memory: bool,
    ) -> None:
        if buffer_count < 1 or buffer_size < 1:
            raise ZeroConfigError(
                f"offload_param.buffer_count and buffer_size must be >= 1, got {buffer_count} and {buffer_size}"
            )
        self.folder, self.io = folder, io
        self.buffer_count, self.buffer_size = buffer_count, buffer_size
        self.max_in_cpu, self.pin_memory = max_in_cpu, pin_memory
        self.dtypes: list[torch.dtype] = []
        self.groups: list[list[_Piece]] = []
        self._pieces: dict[Hashable, _Piece] = {}
        self.cpu_numel = 0  # elements kept in memory (at most max_in_cpu)
        self.file_numel = 0  # elements in the files
        self._spilled = False  # a piece went to a file: every later one does too (model order)
        self._free: list[torch.Tensor] = []
        # the pieces holding a buffer (state other than FILE), in the order they entered their state
        self._active: OrderedDict[Hashable, _Piece] = OrderedDict()
        # observed by the tests
        self.buffers_allocated = 0  # never above buffer_count
        self.peak_buffers_in_use = 0
        self.reads = 0  # pieces read from the files
        self.reads_ahead = 0  # of which issued ahead of use by the fetch schedule
        self.steals = 0  # reads issued ahead and given up for a buffer needed now
        self.writes_behind = 0  # writes left in flight by ``write_range(..., wait=False)``
        self.writes_chained = 0  # writes of a piece that waited for its previous write in flight
        self.piece_writes = 0  # pieces written to the files
        self.settled = 0  # dirty pieces completed from their file before the step had covered them

    # ------------------------------------------------------------------ setup
    def add_group(self, dtype: torch.dtype, pieces: Sequence[tuple[Hashable, str, int, int]]) -> None:
        """Register the next group's pieces ``(key, name, lo, hi)`` (partition coordinates, in model order)
        and reserve its file; contents are written with ``write_piece``."""
        g = len(self.groups)
        self.dtypes.append(dtype)
        size = torch.empty(0, dtype=dtype).element_size()
        out, offset = [], 0
        for key, name, lo, hi in pieces:
            p = _Piece(key, name, g, lo, hi)
            if not self._spilled and self.cpu_numel + p.numel <= self.max_in_cpu:
                p.cpu = torch.empty(p.numel, dtype=dtype)
                self.cpu_numel += p.numel
            else:
                self._spilled = True
                if p.numel > self.buffer_size:
                    raise ZeroConfigError(
                        f"offload_param.buffer_size {self.buffer_size} is smaller than this rank's partition of "
                        f"parameter {name} ({p.numel} elements); set buffer_size to at least the largest "
                        "parameter partition (parameter numel / data-parallel size)"
                    )
                p.offset = offset
                offset += aligned_up(p.numel * size)
                self.file_numel += p.numel
            out.append(p)
            self._pieces[key] = p
        self.groups.append(out)
        self.folder.reserve(self._name(g), offset)

    def _name(self, g: int) -> str:
        return f"g{g}.param.bin"

    def local(self, key: Hashable) -> torch.Tensor:
        """What a parameter's ``ds_tensor`` is: its piece while in memory, else an empty tensor."""
        p = self._pieces.get(key)
        if p is None or p.cpu is None:
            return torch.empty(0, dtype=self.dtypes[p.group] if p else torch.float32)
        return p.cpu

    # ------------------------------------------------------------------ swap states
    def _enter(
        self,
        p: _Piece,
        state: _State,
        buf: torch.Tensor,
        handle: IOHandle | None = None,
        covered: list[tuple[int, int]] | None = None,
    ) -> None:
        """``p`` (holding no buffer) takes ``buf`` into ``state``; it is the newest piece in that state."""
        assert p.state is _State.FILE and state is not _State.FILE, (p.name, p.state, state)
        p.state, p.buf, p.handle, p.covered = state, buf, handle, covered or []
        self._active[p.key] = p

    def _leave(self, p: _Piece) -> tuple[torch.Tensor, IOHandle | None]:
        """``p`` back to ``FILE``: its buffer and the I/O it had in flight are the caller's."""
        assert p.state is not _State.FILE and p.buf is not None, (p.name, p.state)
        held = p.buf, p.handle
        p.state, p.buf, p.handle, p.covered = _State.FILE, None, None, []
        del self._active[p.key]
        return held

    def _in(self, state: _State) -> Iterator[_Piece]:
        """The pieces in ``state``, the oldest in it first."""
        return (p for p in self._active.values() if p.state is state)

    # ------------------------------------------------------------------ buffers
    def _take(self) -> torch.Tensor:
        if self._free:
            buf = self._free.pop()
        elif self.buffers_allocated < self.buffer_count:
            self.buffers_allocated += 1
            size = max(torch.empty(0, dtype=d).element_size() for d in self.dtypes)
            buf = aligned_empty(self.buffer_size * size)
            if self.pin_memory:
                buf = pinned(buf, "offload_param.pin_memory")
        elif writing := list(self._in(_State.WRITING)):  # a write in flight: one that is done, else the oldest
            buf = self._finish_write(next((p for p in writing if p.handle.done()), writing[0]))
        elif dirty := next(self._in(_State.DIRTY), None):  # every buffer partly updated: complete the oldest
            self._settle(dirty)
            buf = self._finish_write(dirty)
        elif ahead := list(self._in(_State.READ_AHEAD)):  # the read issued last is needed last: give it up
            buf, handle = self._leave(ahead[-1])
            handle.wait()
            self.steals += 1
        else:
            raise RuntimeError(
                "offload_param: every swap buffer is in use (a piece taken and not given back)"
            )
        in_use = self.buffers_allocated - len(self._free)
        self.peak_buffers_in_use = max(self.peak_buffers_in_use, in_use)
        return buf

    def _view(self, buf: torch.Tensor, p: _Piece) -> torch.Tensor:
        size = torch.empty(0, dtype=self.dtypes[p.group]).element_size()
        return buf[: p.numel * size].view(self.dtypes[p.group])

    def _read(self, p: _Piece, buf: torch.Tensor) -> IOHandle:
        self.reads += 1
        size = torch.empty(0, dtype=self.dtypes[p.group]).element_size()
        return self.io.read(
            self.folder.file(self._name(p.group)), p.offset, buf[: aligned_up(p.numel * size)]
        )

    def _write(self, p: _Piece, buf: torch.Tensor) -> IOHandle:
        self.piece_writes += 1
        size = torch.empty(0, dtype=self.dtypes[p.group]).element_size()
        return self.io.write(
            self.folder.file(self._name(p.group)), p.offset, buf[: aligned_up(p.numel * size)]
        )

    def _finish_write(self, p: _Piece) -> torch.Tensor:
        """Wait for the piece's write in flight; its buffer (holding the piece's newest values) is the caller's."""
        assert p.state is _State.WRITING, (p.name, p.state)
        buf, handle = self._leave(p)
        try:
            handle.wait()
        except BaseException:
            self._free.append(buf)
            raise
        return buf

    def _settle(self, p: _Piece) -> None:
        """Issue the write of a dirty piece now: the ranges the step has not written yet are read from its
        file straight into the piece's own buffer (no other memory: the buffers stay within buffer_count)."""
        assert p.state is _State.DIRTY, (p.name, p.state)
        covered = p.covered
        buf, _ = self._leave(p)
        size = torch.empty(0, dtype=self.dtypes[p.group]).element_size()
        path = self.folder.file(self._name(p.group))
        self.reads += 1
        handles: list[IOHandle] = []
        error = None
        try:  # buf[0] is at the piece's aligned offset: the aligned middles of the ranges go through O_DIRECT
            for a, b, written in split_written(covered, p.lo, p.hi):
                if not written:
                    for x, y in aligned_spans((a - p.lo) * size, (b - p.lo) * size):
                        handles.append(self.io.read(path, p.offset + x, buf[x:y]))
        except BaseException as e:
            error = e
        for handle in handles:  # every read is done with buf before it is given back
            try:
                handle.wait()
            except BaseException as e:
                error = error or e
        if error is not None:
            self._free.append(buf)
            raise error
        self._enter(p, _State.WRITING, buf, self._write(p, buf))
        self.settled += 1

    def writes_pending(self) -> int:
        """Writes issued and not waited for yet (their buffers still held)."""
        return sum(1 for _ in self._in(_State.WRITING))

    def flush(self) -> None:
        """Write the dirty pieces, wait for every write in flight and free its buffer (the end of a step);
        raises the first error."""
        error = None
        while dirty := next(self._in(_State.DIRTY), None):
            try:
                self._settle(dirty)
            except BaseException as e:  # the other pieces are still written
                error = error or e
        while writing := next(self._in(_State.WRITING), None):
            try:
                self._free.append(self._finish_write(writing))
            except BaseException as e:  # the other writes are still waited for
                error = error or e
        if error is not None:
            raise error

    # ------------------------------------------------------------------ gathers
    def piece(self, key: Hashable) -> torch.Tensor:
        """The piece's values in memory (read now unless a read ahead brought it); ``done`` gives it back."""
        p = self._pieces[key]
        if p.cpu is not None:
            return p.cpu
        assert p.state is not _State.IN_USE, f"offload_param: piece {p.name} taken twice without done()"
        if p.state is _State.DIRTY:
            self._settle(p)
        if p.state is _State.WRITING:  # its buffer holds the newest values: no read
            self._enter(p, _State.IN_USE, self._finish_write(p))
            return self._view(p.buf, p)
        if p.state is _State.READ_AHEAD:
            buf, handle = self._leave(p)
        else:
            buf = self._take()
            handle = self._read(p, buf)
        handle.wait()
        self._enter(p, _State.IN_USE, buf)
        return self._view(buf, p)

    def done(self, key: Hashable) -> None:
        p = self._pieces[key]
        if p.state is _State.IN_USE:
            self._free.append(self._leave(p)[0])

    def read_ahead(self, key: Hashable) -> bool:
        """Start reading a piece the schedule says is needed soon; False when no buffer is free for it."""
        p = self._pieces.get(key)
        if p is None or p.cpu is not None or p.state is not _State.FILE:  # in memory already, or soon
            return True
        if not self._free and self.buffers_allocated >= self.buffer_count:
            return False
        buf = self._take()
        self._enter(p, _State.READ_AHEAD, buf, self._read(p, buf))
        self.reads_ahead += 1
        return True

    def ahead(self) -> int:
        """Reads issued ahead of use and not consumed yet."""
        return sum(1 for _ in self._in(_State.READ_AHEAD))

    def drop_ahead(self, key: Hashable | None = None) -> None:
        """Give up the reads issued ahead (of ``key`` only, when given)."""
        if key is None:
            pieces = list(self._in(_State.READ_AHEAD))
        else:
            p = self._pieces.get(key)
            pieces = [p] if p is not None and p.state is _State.READ_AHEAD else []
        for p in pieces:
            buf, handle = self._leave(p)
            handle.wait()
            self._free.append(buf)

    # ------------------------------------------------------------------ ranges of a partition
    def _overlapping(self, g: int, lo: int, hi: int):
        for p in self.groups[g]:
            a, b = max(lo, p.lo), min(hi, p.hi)
            if a < b:
                yield p, a, b

    def read_range(self, g: int, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of the rank's partition of group ``g`` (padding reads as zeros)."""
        out = torch.zeros(hi - lo, dtype=self.dtypes[g])
        for p, a, b in self._overlapping(g, lo, hi):
            out[a - lo : b - lo].copy_(self.piece(p.key)[a - p.lo : b - p.lo])
            self.done(p.key)
        return out

    def write_range(self, g: int, lo: int, hi: int, values: torch.Tensor, *, wait: bool = True) -> None:
        """Set elements ``[lo, hi)`` of the partition (padding elements are not stored). With ``wait=False``
        the writes stay in flight, each holding its buffer, until ``flush`` (or a use of the piece)."""
        for p, a, b in self._overlapping(g, lo, hi):
            src = values[a - lo : b - lo]
            if p.cpu is not None:
                p.cpu[a - p.lo : b - p.lo].copy_(src)
                continue
            self.drop_ahead(p.key)  # a read issued ahead holds the old values
            assert p.state is not _State.IN_USE, f"offload_param: piece {p.name} written while taken"
            if (a, b) != (p.lo, p.hi) and not wait:  # part of the piece: written once the step has covered it
                if p.state is _State.DIRTY:
                    covered = p.covered
                    buf, _ = self._leave(p)
                elif p.state is _State.WRITING:  # its buffer holds all the newest values
                    self.writes_chained += 1
                    buf, covered = self._finish_write(p), [(p.lo, p.hi)]
                else:
                    buf, covered = self._take(), []
                self._view(buf, p)[a - p.lo : b - p.lo].copy_(src)
                covered = mark_written(covered, a, b)
                if covered != [(p.lo, p.hi)]:
                    self._enter(p, _State.DIRTY, buf, covered=covered)
                    continue
                self._enter(p, _State.WRITING, buf, self._write(p, buf))
                self.writes_behind += 1
                continue
            if p.state is _State.DIRTY:
                self._settle(p)
            self.writes_chained += p.state is _State.WRITING
            if (a, b) == (p.lo, p.hi):
                # a write of the piece in flight is done before this one is issued (the file sees them in order)
                buf = self._finish_write(p) if p.state is _State.WRITING else self._take()
                self._view(buf, p).copy_(src)
            else:  # part of the piece: read (or the buffer of its write in flight, once done), modify, write
                self.piece(p.key)
                buf, _ = self._leave(p)
                self._view(buf, p)[a - p.lo : b - p.lo].copy_(src)
            handle = self._write(p, buf)
            if wait:
                try:
                    handle.wait()
                finally:
                    self._free.append(buf)
            else:
                self._enter(p, _State.WRITING, buf, handle)
                self.writes_behind += 1

    def write_piece(self, key: Hashable, values: torch.Tensor) -> None:
        p = self._pieces[key]
        self.write_range(p.group, p.lo, p.hi, values)

    def file_bytes(self) -> int:
        """Bytes the files hold for the pieces (without the alignment padding)."""
        return sum(p.numel * torch.empty(0, dtype=self.dtypes[p.group]).element_size()
                   for ps in self.groups for p in ps if p.cpu is None)  # fmt: skip

"""Partition gradients in files (``offload_optimizer.device: "nvme"``): ``GradPartitions``' contract on disk.

With the optimizer on NVMe, this rank's partition gradient of each param group lives in ``g{g}.grad.bin``
(the model dtype, or fp32 with ``grad_accum_dtype``) in the optimizer swap's folder (``SwapFolder``:
emptied when a run starts, so a killed run's gradients are never read), as DeepSpeed 0.19.8 swaps the
reduced gradients of each sub-group out to its gradient files. The files are reserved (allocated on disk)
when the optimizer is built, before the masters: a disk too small raises ``NvmeSpaceError`` there, naming
the file and the bytes needed, before any step. A write that still finds the disk full (a file system
where a reservation does not hold the blocks) raises ``NvmeSpaceError`` at the end of that backward.

A reduced bucket's owned slice (``add``) is computed in a staging buffer of its own size and written
asynchronously through the I/O pool; at most ``max_pending`` writes stay in flight (the oldest is waited
for beyond that), and every write is drained when a backward ends (``finish``): a write error surfaces at
that backward. Accumulation (``gradient_accumulation_steps > 1``, or a gradient reduced twice in one
backward) is a read-add-write of the range: the range's earlier value is read back (after any write of it
still in flight) into the staging buffer, the new slice is added there with the same operations the
in-memory partition does, and the sum is written back: the sums are bit for bit those of ``GradPartitions``.
Only the slices in flight are resident, never the partition. That read is waited for where the slice is
absorbed (the backward waits on the disk once per bucket in every micro-step after a window's first): the
in-flight-bucket-only alternative would keep every accumulated range of the window in memory, which is the
partition.

The step reads each sub-group's gradient range into the buffer it reads the master and state into (see
``OptimizerSwap``; the same ``buffer_count`` buffers and ``pipeline_read``). The global norm and the
inf/nan check need every gradient before the first update. The norm is taken as backward writes: each
``NORM_CHUNK`` piece of a group (the pieces ``partition_norm_sq`` cuts) gets its norm, computed exactly as
``partition_norm_sq`` does on a tensor (``norm_of``, fp32), from the values written once a write completes
it (a piece covered by one written range directly; one that several ranges cover is assembled in a
buffer of its own, at most ``MAX_PARTIAL`` at once, the oldest given up). A later write into a piece drops
its norm (gradient accumulation's next micro-step adds into every range and takes it again; with
``track_norms`` false, set by the engine on micro-steps that are not a step's last, none is taken). At the
step, the norm reads from the files only the pieces without a norm; the norm, the clipping and the
overflow skip are bit for bit those of the in-memory gradients. The inf/nan check, needed only when the
sum is not finite, reads the files.

Reads and writes of unaligned ranges are cut into a head, an ``ALIGN``-aligned middle (through
``O_DIRECT``, staying out of the page cache) and a tail (buffered).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from .._aio import ALIGN, AsyncFileIO, IOHandle, aligned_down, aligned_empty, aligned_spans, aligned_up
from .._step import NORM_CHUNK, norm_of
from ._grad_parts import mark_written, split_written
from ._swap import NvmeSpaceError, SwapFolder

__all__ = ["GradFile", "GradSwap"]

ZERO_CHUNK = 1 << 20  # elements of zeros written at a time where no reduction wrote
MAX_PARTIAL = 4  # norm pieces assembled from several writes at once (a piece's values each)


@dataclass(eq=False)
class _Pending:
    group: int
    lo: int
    hi: int
    buf: torch.Tensor
    handles: list[IOHandle]


class GradSwap:
    """One gradient file per param group: ``numels[g]`` elements of ``dtypes[g]``, through the I/O pool."""

    def __init__(
        self,
        folder: SwapFolder,
        io: AsyncFileIO,
        numels: Sequence[int],
        dtypes: Sequence[torch.dtype],
        *,
        max_pending: int = 2,
    ) -> None:
        self.folder, self.io = folder, io
        self.numels, self.dtypes = list(numels), list(dtypes)
        self.devices = [torch.device("cpu")] * len(self.numels)
        self.max_pending = max_pending
        self._written: list[list[tuple[int, int]]] = [[] for _ in self.numels]  # disjoint, sorted
        self._live = [False] * len(self.numels)  # reduced into (or read) since the last clear
        self._pending: list[_Pending] = []
        self.staged_bytes = (
            0  # bytes of the staging buffers alive now, and their peak (observed by the tests)
        )
        self.peak_staged_bytes = 0
        self.read_adds = 0  # ranges accumulated by a read-add-write (observed by the tests)
        self.bytes_written = self.bytes_read = 0  # through the gradient files (observed by the tests)
        self.norm_bytes_read = 0  # of which read back for the norm (pieces without a norm from backward)
        # take the pieces' norms as they are written (off: a micro-step that is not its window's last)
        self.track_norms = True
        self.norms: list[dict[tuple[int, int], torch.Tensor]] = [{} for _ in self.numels]  # piece -> norm
        self._partial: dict[tuple[int, int, int], tuple[torch.Tensor, list[tuple[int, int]]]] = {}
        self._scratch: dict[torch.dtype, torch.Tensor] = {}  # norm_of's cast buffer
        for g, n in enumerate(self.numels):
            folder.reserve(self.name(g), n * self.dtypes[g].itemsize)

    def __len__(self) -> int:
        return len(self.numels)

    def __iter__(self) -> Iterator[GradFile]:
        """Every group's gradient file, complete (zeros where no backward reduced) and drained: the step's."""
        self._live = [True] * len(self.numels)
        self.finish()
        return iter([GradFile(self, g) for g in range(len(self.numels))])

    @property
    def allocated(self) -> list[bool]:
        return list(self._live)

    def name(self, g: int) -> str:
        return f"g{g}.grad.bin"

    def path(self, g: int) -> str:
        return self.folder.file(self.name(g))

    # ------------------------------------------------------------------ backward
    def add(self, g: int, lo: int, hi: int, grad: torch.Tensor, alpha: float) -> None:
        """``part[lo:hi] += alpha * grad`` in the file (written, not added, where nothing was reduced yet)."""
        self._live[g] = True
        src = grad.to("cpu")
        runs = self._split(g, lo, hi)
        buf, target = self._stage(g, lo, hi)
        if any(written for _, _, written in runs):
            self._wait_overlapping(g, lo, hi)
            handles = [
                h for a, b, written in runs if written for h in self._transfer(g, buf, lo, a, b, False)
            ]
            for h in handles:
                h.wait()
            self.read_adds += 1
        for a, b, written in runs:
            if written:  # the in-memory partition's operations exactly (see GradPartitions.add)
                target[a - lo : b - lo].add_(src[a - lo : b - lo], alpha=alpha)
            else:
                target[a - lo : b - lo].copy_(src[a - lo : b - lo])
                if alpha != 1.0:
                    target[a - lo : b - lo].mul_(alpha)
        self._note(g, lo, hi, target)
        self._mark(g, lo, hi)
        self._push(_Pending(g, lo, hi, buf, self._transfer(g, buf, lo, lo, hi, True)))

    def finish(self) -> None:
        """Zero what no reduction wrote in a live group (padding), then wait for every write: a backward's end."""
        for g in range(len(self.numels)):
            if not self._live[g]:
                continue
            for a, b, written in self._split(g, 0, self.numels[g]):
                for c in range(a, b, ZERO_CHUNK) if not written else ():
                    d = min(b, c + ZERO_CHUNK)
                    buf, target = self._stage(g, c, d)
                    target.zero_()
                    self._note(g, c, d, target)
                    self._push(_Pending(g, c, d, buf, self._transfer(g, buf, c, c, d, True)))
            self._written[g] = [(0, self.numels[g])]
        self.drain()

    def drain(self) -> None:
        while self._pending:
            self._retire(self._pending[0])

    def clear(self) -> None:
        """After a step: the next reduction into any range writes, not adds (the files stay, reserved)."""
        self.drain()
        self._written = [[] for _ in self.numels]
        self._live = [False] * len(self.numels)
        self.norms = [{} for _ in self.numels]
        self._partial = {}

    # ------------------------------------------------------------------ single ranges (fragments)
    def read(self, g: int, lo: int, hi: int) -> torch.Tensor | None:
        """Elements ``[lo, hi)`` as they stand (zeros where nothing was reduced); None when the group has no
        gradient since the step (as ``GradPartitions.get``)."""
        if not self._live[g]:
            return None
        self.finish()
        buf, target = self._stage(g, lo, hi)
        for h in self._transfer(g, buf, lo, lo, hi, False):
            h.wait()
        self._unstage(buf)
        return target.clone()

    def write(self, g: int, lo: int, hi: int, values: torch.Tensor) -> None:
        """Set elements ``[lo, hi)`` (the rest of the group reads as it stood, zeros where nothing was reduced)."""
        self._live[g] = True
        self.finish()
        buf, target = self._stage(g, lo, hi)
        target.copy_(values)
        self._note(g, lo, hi, target)
        self._push(_Pending(g, lo, hi, buf, self._transfer(g, buf, lo, lo, hi, True)))
        self.drain()

    # ------------------------------------------------------------------ the step's reads
    def region_bytes(self, numel: int) -> int:
        """Bytes of a region of a step buffer that holds any range of ``numel`` elements of any group."""
        return aligned_up(numel * max((d.itemsize for d in self.dtypes), default=1) + ALIGN)

    def read_into(self, region: torch.Tensor, g: int, lo: int, a: int, b: int) -> list[IOHandle]:
        """Issue the read of ``[a, b)`` into ``region`` (aligned, ``region_bytes`` long), which stages a range
        starting at ``lo`` (``region_view(region, g, lo, hi)`` shows it once every part is read)."""
        return self._transfer(g, region, lo, a, b, False)

    def region_view(self, region: torch.Tensor, g: int, lo: int, hi: int) -> torch.Tensor:
        """The gradient ``read_into`` put in ``region``, in the group's dtype (once its handles are waited)."""
        es = self.dtypes[g].itemsize
        pad = lo * es % ALIGN
        return region[pad : pad + (hi - lo) * es].view(self.dtypes[g])

    # ------------------------------------------------------------------ the norm, as backward writes
    def _note(self, g: int, lo: int, hi: int, values: torch.Tensor) -> None:
        """``[lo, hi)`` now holds ``values``: the norms of the pieces it touches are dropped and, with
        ``track_norms``, taken again for every piece whose values are all known (see the module's text)."""
        n, norms = self.numels[g], self.norms[g]
        for c in range(lo // NORM_CHUNK * NORM_CHUNK, hi, NORM_CHUNK):
            piece = (c, min(n, c + NORM_CHUNK))
            norms.pop(piece, None)
            a, b = max(lo, c), min(hi, piece[1])
            if not self.track_norms:
                self._partial.pop((g, *piece), None)
                continue
            if (a, b) == piece:
                norms[piece] = norm_of(values[a - lo : b - lo], torch.float32, self._scratch)
                self._partial.pop((g, *piece), None)
                continue
            buf, covered = self._partial.pop((g, *piece), (None, []))
            if buf is None:
                buf = torch.empty(piece[1] - c, dtype=self.dtypes[g])
            buf[a - c : b - c].copy_(values[a - lo : b - lo])
            covered = mark_written(covered, a, b)
            if covered == [piece]:
                norms[piece] = norm_of(buf, torch.float32, self._scratch)
                continue
            self._partial[(g, *piece)] = (buf, covered)  # the newest last
            while len(self._partial) > MAX_PARTIAL:
                del self._partial[next(iter(self._partial))]

    # ------------------------------------------------------------------ internals
    def _stage(self, g: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A staging buffer for ``[lo, hi)`` whose byte 0 sits at an ``ALIGN`` boundary of the file."""
        es = self.dtypes[g].itemsize
        buf = self._stage_buffer(lo * es % ALIGN + (hi - lo) * es)
        return buf, self._target(buf, g, lo, hi)

    def _stage_buffer(self, nbytes: int) -> torch.Tensor:
        buf = aligned_empty(nbytes)
        self.staged_bytes += buf.numel()
        self.peak_staged_bytes = max(self.peak_staged_bytes, self.staged_bytes)
        return buf

    def _target(self, buf: torch.Tensor, g: int, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` in a staging buffer (staged for a range starting at ``lo``)."""
        es = self.dtypes[g].itemsize
        pad = lo * es % ALIGN
        return buf[pad : pad + (hi - lo) * es].view(self.dtypes[g])

    def _unstage(self, buf: torch.Tensor) -> None:
        self.staged_bytes -= buf.numel()

    def _transfer(self, g: int, buf: torch.Tensor, lo: int, a: int, b: int, write: bool) -> list[IOHandle]:
        """Move elements ``[a, b)`` between the file and ``buf`` (staged for a range starting at ``lo``):
        the aligned middle as one request (O_DIRECT), the unaligned head and tail each as another."""
        es = self.dtypes[g].itemsize
        base = aligned_down(lo * es)  # the file offset of buf[0]
        off0, off1 = a * es, b * es
        path = self.path(g)
        if write:
            self.bytes_written += off1 - off0
        else:
            self.bytes_read += off1 - off0
        handles = []
        for x, y in aligned_spans(off0, off1):
            piece = buf[x - base : y - base]
            handles.append(self.io.write(path, x, piece) if write else self.io.read(path, x, piece))
        return handles

    def _push(self, p: _Pending) -> None:
        self._pending.append(p)
        while len(self._pending) > self.max_pending:
            self._retire(self._pending[0])

    def _retire(self, p: _Pending) -> None:
        self._pending.remove(p)
        self._unstage(p.buf)
        try:
            for h in p.handles:
                h.wait()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            nbytes = (p.hi - p.lo) * self.dtypes[p.group].itemsize
            free = shutil.disk_usage(self.folder.path).free
            raise NvmeSpaceError(
                errno.ENOSPC,
                f"no space left writing the gradient file {self.path(p.group)}: needs {nbytes} bytes, {free} "
                "bytes free on that file system; free space there or point nvme_path at a larger disk",
            ) from None

    def _wait_overlapping(self, g: int, lo: int, hi: int) -> None:
        for p in [p for p in self._pending if p.group == g and p.lo < hi and lo < p.hi]:
            self._retire(p)

    def _split(self, g: int, lo: int, hi: int) -> list[tuple[int, int, bool]]:
        return split_written(self._written[g], lo, hi)

    def _mark(self, g: int, lo: int, hi: int) -> None:
        self._written[g] = mark_written(self._written[g], lo, hi)


class GradFile:
    """One group's complete gradient in its file, as the step's norm sees it (``partition_norm_sq``)."""

    def __init__(self, swap: GradSwap, g: int) -> None:
        self.swap, self.group = swap, g

    def numel(self) -> int:
        return self.swap.numels[self.group]

    def _pieces(self, bounds: list[tuple[int, int]]) -> Iterator[torch.Tensor]:
        """Each ``[a, b)`` read from the file in turn, the next one's read in flight meanwhile, through two
        staging buffers allocated once for the pass (one per piece would fault in fresh pages each time)."""
        swap, g = self.swap, self.group
        if not bounds:
            return
        es = swap.dtypes[g].itemsize
        swap.norm_bytes_read += sum(b - a for a, b in bounds) * es
        size = max(b - a for a, b in bounds) * es + ALIGN
        bufs = [swap._stage_buffer(size) for _ in range(min(2, len(bounds)))]
        ahead: list[tuple[torch.Tensor, list[IOHandle]]] = []
        try:
            for i in range(len(bounds) + 1):
                if i < len(bounds):
                    a, b = bounds[i]
                    buf = bufs[i % len(bufs)]
                    ahead.append((swap._target(buf, g, a, b), swap._transfer(g, buf, a, a, b, False)))
                if i == 0:
                    continue
                target, handles = ahead[0]
                for h in handles:
                    h.wait()
                yield target
                ahead.pop(0)
        finally:  # left early (an inf found): the read still in flight is waited for
            for _, handles in ahead:
                for h in handles:
                    h.wait()
            for buf in bufs:
                swap._unstage(buf)

    def piece_norms(
        self, ranges: Sequence[tuple[int, int]], dtype: torch.dtype, chunk: int
    ) -> list[torch.Tensor]:
        """Each piece's norm: as taken when backward wrote it (``GradSwap._note``), else read from the file."""
        bounds = [(c, min(hi, c + chunk)) for lo, hi in ranges for c in range(lo, hi, chunk)]
        known = self.swap.norms[self.group] if dtype == torch.float32 and chunk == NORM_CHUNK else {}
        scratch: dict[torch.dtype, torch.Tensor] = {}
        read = iter([norm_of(t, dtype, scratch) for t in self._pieces([b for b in bounds if b not in known])])
        return [known[b] if b in known else next(read) for b in bounds]

    def all_finite(self, chunk: int) -> bool:
        n = self.numel()
        return all(
            bool(torch.isfinite(t).all())
            for t in self._pieces([(c, min(n, c + chunk)) for c in range(0, n, chunk)])
        )

"""NVMe offload of the optimizer (``offload_optimizer.device: "nvme"``): fp32 masters and optimizer state in files.

Each rank keeps, under ``nvme_path/ds_swap/rank{r:05d}/`` (``SwapFolder``), one file per param group
and tensor: ``g{g}.master.bin`` (the fp32 master partition) and ``g{g}.{key}.bin`` for every element-wise
state tensor of the inner optimizer (Adam's ``exp_avg``, ``exp_avg_sq``); per-view scalars (Adam's
``step``) stay in memory. The files are scratch in ds's own layout, never a checkpoint: the folder is
emptied when a run starts, so a new run never reads an old run's swap files as state (the decision in
docs/design.md §7); checkpoints stay ds's portable format.

The step streams the sub-groups through ``buffer_count`` buffers: a sub-group's master, state and gradient
are read into a buffer, the inner optimizer steps it a view at a time (the views of at most ``STEP_PIECE``
elements that bound its temporaries, see ``_subgroups``), each view's updated master is copied into the
weight partition, and the buffer is written back (one request per tensor). The reads are issued all at once,
a view at a time in the order the step takes them, and each view steps as soon as its own bytes are in, so
the inner optimizer computes while the disk reads the sub-group's later views (within one sub-group: what
``pipeline_read`` adds is reading the next sub-groups). A
sub-group here is what DeepSpeed swaps at once: consecutive views of one group, ``sub_group_size``
elements at most (capped at ``SWAP_UNIT_MAX``, and never less than one view): larger sub-groups cost
memory (each buffer holds one) and move their bytes in fewer, longer transfers, which this disk serves
faster (docs/benchmarks.md, "Swap units of sub_group_size"). ``pipeline_read`` issues the reads of the
next sub-groups (as many as free buffers allow) before stepping the current one; ``pipeline_write`` leaves
a buffer's write in flight while the next sub-groups step (it is waited for when the buffer is needed
again, or at the end of the step). Without them each read and write is waited for where it is issued.
The buffers live from the step's first read (``prefetch``) to its end: between steps memory holds none of
them (held, the 2.6 GB of a 1B model's four 46M-element sub-groups slowed the next forward+backward by 3-4
s, docs/benchmarks.md "Swap units of sub_group_size"). ``pin_memory`` allocates the buffers page-locked
(``torch.Tensor.pin_memory``; only where an accelerator makes that possible: on a CPU-only machine it is a
no-op, said once in the log).

The partition gradients are in files too (``g{g}.grad.bin``, ``GradSwap`` in ``_grad_swap``): each buffer
starts with a region the step reads the sub-group's gradient into, with its master and state.

What stays in memory: the weight partitions (unless ``offload_param`` is ``nvme`` too); ``buffer_count``
buffers; during backward the gradient slices being written (see ``_grad_swap``).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import torch

from .._aio import AsyncFileIO, IOHandle, aligned_empty, aligned_up, pinned
from .._errors import ZeroConfigError
from ._subgroups import ScaledGrad
from ._swap_folders import hold_marker, remove_vanished_ranks


class GradRegions(Protocol):
    """Gradients in files that the step reads into a region of each buffer (``_grad_swap.GradSwap``)."""

    def region_bytes(self, numel: int) -> int: ...

    def read_into(self, region: torch.Tensor, g: int, lo: int, a: int, b: int) -> list[IOHandle]: ...

    def region_view(self, region: torch.Tensor, g: int, lo: int, hi: int) -> torch.Tensor: ...


__all__ = ["SWAP_UNIT_MAX", "NvmeSpaceError", "OptimizerSwap", "SwapFolder", "swap_unit"]

logger = logging.getLogger("ds_zero")

MASTER = "master"
# elements per swapped sub-group at most (~0.9 GB a buffer with Adam and bf16 gradients)
SWAP_UNIT_MAX = 1 << 26


def swap_unit(sub_group_size: int) -> int:
    """Elements of the sub-group a step buffer holds: ``sub_group_size``, at most ``SWAP_UNIT_MAX`` (said in
    the log when it caps: DeepSpeed's default of 1e9 would make each of the ``buffer_count`` buffers ~14 GB)."""
    if sub_group_size > SWAP_UNIT_MAX:
        logger.info(
            "offload_optimizer nvme: swapping sub-groups of %d elements (sub_group_size %d is above ds's cap; "
            "set sub_group_size lower for less buffer memory)",
            SWAP_UNIT_MAX,
            sub_group_size,
        )
    return min(sub_group_size, SWAP_UNIT_MAX)


class NvmeSpaceError(OSError):
    """The disk under ``nvme_path`` ran out of space for the swap files."""


class SwapFolder:
    """This rank's folder of swap files under ``nvme_path/name``; emptied when created (stale files are scratch).
    With ``world`` (the ranks of this run), the folders ds made for ranks >= ``world`` (a run with more
    ranks before) and no live process uses are removed (``_swap_folders``)."""

    def __init__(
        self, nvme_path: str | None, rank: int, key: str, name: str = "ds_swap", world: int | None = None
    ) -> None:
        if not nvme_path:
            raise ZeroConfigError(f"zero_optimization.{key}.device 'nvme' needs {key}.nvme_path: a directory")
        if not os.path.isdir(nvme_path):
            raise ZeroConfigError(
                f"zero_optimization.{key}.nvme_path {nvme_path!r} does not exist or is not a directory; "
                "create it (on a fast local disk) or point nvme_path at one"
            )
        if not os.access(nvme_path, os.W_OK | os.X_OK):
            raise ZeroConfigError(
                f"zero_optimization.{key}.nvme_path {nvme_path!r} is not writable by this process; "
                "fix its permissions or point nvme_path at a writable directory"
            )
        self.path = os.path.join(nvme_path, name, f"rank{rank:05d}")
        if os.path.isdir(self.path):  # a previous (killed) run's files: scratch, never state
            shutil.rmtree(self.path)
        os.makedirs(self.path)
        self._marker = hold_marker(self.path)
        self.removed = [] if world is None else remove_vanished_ranks(os.path.dirname(self.path), world)

    def __del__(self) -> None:
        marker = getattr(self, "_marker", -1)
        if marker >= 0:
            os.close(marker)
            self._marker = -1

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def reserve(self, name: str, nbytes: int) -> str:
        """Create ``name`` with ``nbytes`` allocated on disk; a full disk raises ``NvmeSpaceError``."""
        path = self.file(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if nbytes:
                os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            free = shutil.disk_usage(self.path).free
            raise NvmeSpaceError(
                errno.ENOSPC,
                f"no space left for NVMe swap file {path}: needs {nbytes} bytes, {free} bytes free on that "
                "file system; free space there or point nvme_path at a larger disk",
            ) from None
        finally:
            os.close(fd)
        return path


class OptimizerSwap:
    """fp32 masters and element-wise optimizer state of every sub-group view, kept in files.

    ``views[g]`` are the inner optimizer's parameters (``SubGroups.views``); between steps their ``.data``
    and their state tensors are empty. ``step`` streams them through the buffers, ``unit_numel`` elements
    of consecutive views at a time (one view a time without it); ``resident`` makes everything whole in
    memory for a checkpoint or a load.
    """

    def __init__(
        self,
        folder: SwapFolder,
        io: AsyncFileIO,
        views: list[list[torch.Tensor]],
        *,
        buffer_count: int,
        pipeline_read: bool,
        pipeline_write: bool,
        pin_memory: bool,
        grads: GradRegions | None = None,
        unit_numel: int | None = None,
    ) -> None:
        if buffer_count < 1:
            raise ZeroConfigError(f"offload_optimizer.buffer_count must be >= 1, got {buffer_count}")
        self.folder, self.io, self.views = folder, io, views
        self.buffer_count = buffer_count
        self.pipeline_read, self.pipeline_write, self.pin_memory = pipeline_read, pipeline_write, pin_memory
        self.keys: list[str] = []  # element-wise state tensors, known after the first step
        self.bounds = [[(0, 0)] * len(vs) for vs in views]  # (lo, hi) of each view in its partition
        for g, vs in enumerate(views):
            lo = 0
            for k, v in enumerate(vs):
                self.bounds[g][k] = (lo, lo + v.numel())
                lo += v.numel()
        self.numels = [b[-1][1] if b else 0 for b in self.bounds]
        self.units = self._cut_units(unit_numel)  # (g, first view, end view): what one buffer holds
        self.buffers_allocated = 0  # alive now (observed by the tests: never above buffer_count)
        self.peak_buffers = 0  # the most alive at once
        self.reads_ahead = 0  # reads issued before the previous sub-group's step (pipeline_read)
        self.prefetched = 0  # of which issued by prefetch(), before the step's gradient norm
        self.writes_deferred = 0  # writes left in flight past their sub-group's step (pipeline_write)
        self.trace: list[tuple[str, float, float, int]] | None = None  # a list: the update's intervals
        self._free: list[torch.Tensor] = []
        self._ahead: dict[int, tuple[torch.Tensor, list[IOHandle]]] = {}  # prefetch(): unit index -> read
        self._slots = 1  # master + state tensors per buffer
        largest = max((self._span(u)[1] - self._span(u)[0] for u in self.units), default=0)
        self._stride = aligned_up(4 * largest)
        # with the gradients in files too (``_grad_swap``) each buffer starts with a region for a unit's gradient
        self.grads = grads
        self._grad_bytes = grads.region_bytes(largest) if grads else 0

    def _cut_units(self, unit_numel: int | None) -> list[tuple[int, int, int]]:
        """Runs of consecutive views of one group, at most ``unit_numel`` elements each (at least one view)."""
        units = []
        for g, bounds in enumerate(self.bounds):
            k0 = 0
            for k in range(1, len(bounds) + 1):
                if k == len(bounds) or unit_numel is None or bounds[k][1] - bounds[k0][0] > unit_numel:
                    units.append((g, k0, k))
                    k0 = k
        return units

    def _span(self, unit: tuple[int, int, int]) -> tuple[int, int]:
        g, k0, k1 = unit
        return self.bounds[g][k0][0], self.bounds[g][k1 - 1][1]

    @property
    def buffer_bytes(self) -> int:
        """Bytes of one step buffer (a unit's gradient region, master and state)."""
        return aligned_up(self._grad_bytes + self._stride * self._slots)

    # ------------------------------------------------------------------ files
    def _name(self, g: int, key: str) -> str:
        return f"g{g}.{key}.bin"

    def _path(self, g: int, key: str) -> str:
        return self.folder.file(self._name(g, key))

    def init_masters(self, fill: Callable[[int, int, int], torch.Tensor]) -> None:
        """Write every group's fp32 master: ``fill(g, lo, hi)`` gives elements ``[lo, hi)``, a view at a time."""
        for g, n in enumerate(self.numels):
            self.folder.reserve(self._name(g, MASTER), n * 4)
            for lo, hi in self.bounds[g]:
                self.io.write(self._path(g, MASTER), lo * 4, fill(g, lo, hi).contiguous()).wait()
        for vs in self.views:
            for v in vs:
                v.data = torch.empty(0)

    def _reserve_state(self, keys: list[str]) -> None:
        for key in keys:
            for g, n in enumerate(self.numels):
                self.folder.reserve(self._name(g, key), n * 4)

    # ------------------------------------------------------------------ buffers
    def _take_buffer(self, writes: deque) -> torch.Tensor:
        if self._free:
            return self._free.pop()
        if self.buffers_allocated < self.buffer_count:
            self.buffers_allocated += 1
            self.peak_buffers = max(self.peak_buffers, self.buffers_allocated)
            buf = aligned_empty(self.buffer_bytes)
            if self.pin_memory:
                buf = pinned(buf, "offload_optimizer.pin_memory")
            return buf
        buf, handle = writes.popleft()  # the oldest write in flight gives its buffer back
        handle.wait()
        return buf

    def _slot(self, buf: torch.Tensor, j: int, numel: int) -> torch.Tensor:
        at = self._grad_bytes + j * self._stride
        return buf[at : at + numel * 4].view(torch.float32)

    # ------------------------------------------------------------------ one unit in and out
    def _read(self, buf: torch.Tensor, unit: tuple[int, int, int]) -> list[_Joined]:
        """Issue the reads of a unit, a view at a time in the order the step takes them (each view's master,
        state and gradient, then the next view's): one handle per view, so that a view steps as soon as its
        own bytes are in while the disk reads the unit's later views."""
        g, k0, k1 = unit
        lo, hi = self._span(unit)
        slots = [self._slot(buf, j, hi - lo) for j in range(1 + len(self.keys))]
        per_view = []
        for a, b in self.bounds[g][k0:k1]:
            handles = [
                self.io.read(self._path(g, key), a * 4, slot[a - lo : b - lo])
                for key, slot in zip([MASTER, *self.keys], slots)
            ]
            if self.grads is not None:
                handles += self.grads.read_into(buf[: self._grad_bytes], g, lo, a, b)
            per_view.append(_Joined(handles))
        return per_view

    def _attach(
        self, optimizer: torch.optim.Optimizer, buf: torch.Tensor, unit: tuple[int, int, int], k: int
    ) -> None:
        g = unit[0]
        lo, hi = self._span(unit)
        a, b = self.bounds[g][k]
        view = self.views[g][k]
        view.data = self._slot(buf, 0, hi - lo)[a - lo : b - lo]
        state = optimizer.state.get(view)
        if state is not None:
            for j, key in enumerate(self.keys, start=1):
                state[key] = self._slot(buf, j, hi - lo)[a - lo : b - lo]

    def _write(self, buf: torch.Tensor, unit: tuple[int, int, int], keys: list[str]) -> list[IOHandle]:
        """The unit's master and state ``keys``, as the step left them in ``buf``: one request per tensor."""
        g = unit[0]
        lo, hi = self._span(unit)
        return [
            self.io.write(self._path(g, key), lo * 4, self._slot(buf, j, hi - lo))
            for j, key in enumerate([MASTER, *keys])
        ]

    def _write_first(self, optimizer: torch.optim.Optimizer, g: int, k: int) -> list[IOHandle]:
        """The first step's state of view ``k``, written from the tensors the optimizer allocated itself."""
        lo = self.bounds[g][k][0]
        state = optimizer.state.get(self.views[g][k], {})
        return [self.io.write(self._path(g, key), lo * 4, state[key]) for key in self.keys]

    def _detach(self, optimizer: torch.optim.Optimizer, g: int, k: int) -> None:
        view = self.views[g][k]
        view.data = torch.empty(0)
        state = optimizer.state.get(view)
        if state is not None:
            for key in self.keys:
                state[key] = torch.empty(0)

    def _learn_keys(self, optimizer: torch.optim.Optimizer, g: int, k: int) -> None:
        """After the first step: which state tensors are element-wise (swapped) and must have files."""
        view = self.views[g][k]
        n = view.numel()
        keys = [
            key
            for key, t in optimizer.state.get(view, {}).items()
            if torch.is_tensor(t) and t.dim() == 1 and t.numel() == n
        ]
        for key in keys:
            if optimizer.state[view][key].dtype != torch.float32:
                raise ZeroConfigError(
                    f"NVMe optimizer offload swaps fp32 state; the optimizer keeps {key!r} in "
                    f"{optimizer.state[view][key].dtype}"
                )
        self.keys = keys
        self._reserve_state(keys)

    # ------------------------------------------------------------------ the step
    def prefetch(self) -> None:
        """With ``pipeline_read``: issue the reads of the first sub-groups (one per buffer) now, so that they
        run under the work that precedes the step (the gradient norm's all-reduce, the overflow check);
        ``step`` takes them over, a skipped step drops them (``drop_prefetched``)."""
        if not self.pipeline_read or self._ahead:
            return
        writes: deque = deque()
        for i in range(min(self.buffer_count, len(self.units))):
            if not self._free and self.buffers_allocated >= self.buffer_count:
                break
            buf = self._take_buffer(writes)
            self._ahead[i] = (buf, self._read(buf, self.units[i]))
            self.reads_ahead += 1
            self.prefetched += 1

    def drop_prefetched(self) -> None:
        """Prefetched reads are of the files as they were: dropped (waited, their buffers released) before a
        change of the files, or when the step they were for is skipped."""
        for _buf, per_view in self._ahead.values():
            for h in per_view:
                h.wait()
        self.buffers_allocated -= len(self._ahead)
        self._ahead = {}

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        grads: Sequence,
        inv_scale: float,
        updated: Callable[[int, int, int, torch.Tensor], None],
    ) -> None:
        """One optimizer step over every view, streamed; ``updated(g, lo, hi, master)`` sees each new master.

        With ``grads`` (``GradSwap``) each unit's gradient is read into its buffer with the master and state
        (the ``grads`` argument is then the files, unused here); else ``grads[g]`` is group ``g``'s in memory."""
        units = self.units
        reads, self._ahead = self._ahead, {}
        writes: deque = deque()  # (buffer, handle) in issue order
        scaled = ScaledGrad()
        first = not self.keys and not any(optimizer.state.get(v) for vs in self.views for v in vs)
        for i, unit in enumerate(units):
            if i not in reads:
                buf = self._take_buffer(writes)
                reads[i] = (buf, self._read(buf, unit))
            if self.pipeline_read:  # the next units' reads go out before this one steps
                while writes and writes[0][1].done():  # buffers whose writes finished are free again
                    done_buf, handle = writes.popleft()
                    handle.wait()
                    self._free.append(done_buf)
                for j in range(i + 1, len(units)):
                    if j in reads:
                        continue
                    if not self._free and self.buffers_allocated >= self.buffer_count:
                        break
                    buf = self._take_buffer(writes)
                    reads[j] = (buf, self._read(buf, units[j]))
                    self.reads_ahead += 1
            buf, per_view = reads.pop(i)
            g, k0, k1 = unit
            lo, hi = self._span(unit)
            region = (
                self.grads.region_view(buf[: self._grad_bytes], g, lo, hi) if self.grads is not None else None
            )
            first_writes: list[IOHandle] = []
            for k in range(k0, k1):
                per_view[k - k0].wait()  # this view's bytes; the disk goes on with the later views'
                self._attach(optimizer, buf, unit, k)
                a, b = self.bounds[g][k]
                view = self.views[g][k]
                grad = region[a - lo : b - lo] if region is not None else grads[g][a:b]
                view.grad = scaled(grad, inv_scale, view.device)
                t0 = time.perf_counter()
                optimizer.step()
                if self.trace is not None:
                    self.trace.append(("update", t0, time.perf_counter(), b - a))
                view.grad = None
                updated(g, a, b, view.data)
                if first:  # state tensors the optimizer allocated itself: written from where they are
                    if i == 0 and k == k0:
                        self._learn_keys(optimizer, g, k)
                    first_writes += self._write_first(optimizer, g, k)
            handle = _Joined(self._write(buf, unit, [] if first else self.keys) + first_writes)
            if first:
                handle.wait()
                for k in range(k0, k1):
                    self._detach(optimizer, g, k)
                self._free.append(buf)
                continue
            if self.pipeline_write:
                self.writes_deferred += 1
            else:
                handle.wait()
            writes.append((buf, handle))
            for k in range(k0, k1):
                self._detach(optimizer, g, k)
        while writes:
            writes.popleft()[1].wait()
        self._slots = 1 + len(self.keys)  # the first step's buffers held the master only
        self._free, self.buffers_allocated = [], 0  # released: between steps memory holds none

    # ------------------------------------------------------------------ ranges and whole state
    def read_range(self, g: int, key: str, lo: int, hi: int) -> torch.Tensor:
        """Elements ``[lo, hi)`` of group ``g``'s ``key`` (``"master"`` or a state key), read now."""
        self._check_key(key)
        out = torch.empty(hi - lo, dtype=torch.float32)
        self.io.read(self._path(g, key), lo * 4, out).wait()
        return out

    def write_range(self, g: int, key: str, lo: int, hi: int, values: torch.Tensor) -> None:
        self._check_key(key)
        self.drop_prefetched()
        self.io.write(self._path(g, key), lo * 4, values.to(torch.float32).contiguous()).wait()

    def _check_key(self, key: str) -> None:
        if key != MASTER and key not in self.keys:
            raise ZeroConfigError(
                f"the optimizer has no element-wise state {key!r} (it has {self.keys or 'none yet'})"
            )

    @contextmanager
    def resident(self, optimizer: torch.optim.Optimizer, *, write: bool) -> Iterator[list[torch.Tensor]]:
        """Every group's master and state whole in memory (a checkpoint save or load) while inside; with
        ``write`` they are written back to the files on exit."""
        self.drop_prefetched()
        masters = []
        states: list[dict[str, torch.Tensor]] = []
        for g, n in enumerate(self.numels):
            master = torch.empty(n, dtype=torch.float32)
            self.io.read(self._path(g, MASTER), 0, master).wait()
            full = {}
            for key in self.keys:
                full[key] = torch.empty(n, dtype=torch.float32)
                self.io.read(self._path(g, key), 0, full[key]).wait()
            masters.append(master)
            states.append(full)
            for view, (lo, hi) in zip(self.views[g], self.bounds[g]):
                view.data = master[lo:hi]
                state = optimizer.state.get(view)
                if state is not None:
                    for key in self.keys:
                        state[key] = full[key][lo:hi]
        try:
            yield masters
        finally:
            if write:
                first = self.views[0][0] if self.views and self.views[0] else None
                if not self.keys and first is not None and optimizer.state.get(first):
                    self._learn_keys_from_load(optimizer)
                for g, vs in enumerate(self.views):
                    self.io.write(self._path(g, MASTER), 0, masters[g]).wait()
                    for key in self.keys:
                        whole = torch.cat([optimizer.state[v][key] for v in vs])
                        self.io.write(self._path(g, key), 0, whole).wait()
            for g, vs in enumerate(self.views):
                for k in range(len(vs)):
                    self._detach(optimizer, g, k)

    def _learn_keys_from_load(self, optimizer: torch.optim.Optimizer) -> None:
        """A load gave the optimizer state before any step: learn its keys (and make their files)."""
        self._learn_keys(optimizer, 0, 0)
        self._slots = 1 + len(self.keys)


class _Joined:
    """Several handles waited as one."""

    def __init__(self, handles: list[IOHandle]) -> None:
        self.handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def wait(self) -> None:
        for h in self.handles:
            h.wait()

"""Collective helpers shared by stage 0 and ZeRO: averaging rule, bucket planning, rank mapping, and the
choice of collective per backend (the one place that chooses)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from . import _transport

if TYPE_CHECKING:
    from ._layout import GroupLayout

ProcessGroup = dist.ProcessGroup


@dataclass(frozen=True)
class AveragingRule:
    """How a bucket is scaled around its SUM reduction (docs/design.md §5).

    postscale (default): ``t *= 1/predivide`` -> SUM -> ``t *= predivide/dp``.
    prescale: ``t *= 1/dp`` -> SUM (``predivide`` is ignored, as in DeepSpeed).
    ``average=False`` (``gradient_allreduce_op: "sum"``): SUM alone, neither scaling (as in DeepSpeed).
    """

    dp: int
    prescale: bool = False
    predivide: float = 1.0
    average: bool = True

    def before(self, t: torch.Tensor) -> None:
        """Scale a bucket in place before it is summed across ranks."""
        if not self.average:
            return
        if self.prescale:
            if self.dp != 1:
                t.mul_(1.0 / self.dp)
        elif self.predivide != 1.0:
            t.mul_(1.0 / self.predivide)

    def after_factor(self) -> float:
        """The factor applied to the summed bucket (1.0 when nothing is left to do)."""
        if not self.average or self.prescale or self.predivide == self.dp:
            return 1.0
        return self.predivide / self.dp

    def after(self, t: torch.Tensor) -> None:
        """Scale a summed bucket in place."""
        factor = self.after_factor()
        if factor != 1.0:
            t.mul_(factor)


def plan_buckets(sizes: Sequence[int], limit_elems: int) -> list[list[int]]:
    """Split item indices (in the given order) into buckets of at most ``limit_elems`` elements.

    A bucket is closed before the item that would push it past the limit; an item larger than the
    limit travels alone. Every rank computes the same plan from the same sizes, so collectives match.
    """
    if limit_elems < 1:
        raise ValueError(f"bucket size must be at least 1 element, got {limit_elems}")
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, n in enumerate(sizes):
        if current and filled + n > limit_elems:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n
    if current:
        buckets.append(current)
    return buckets


def group_size(group: ProcessGroup | None) -> int:
    """World size of ``group`` (the default group when None)."""
    return dist.get_world_size(group) if dist.is_initialized() else 1


def group_rank(group: ProcessGroup | None) -> int:
    """This process's rank inside ``group``."""
    return dist.get_rank(group) if dist.is_initialized() else 0


def global_rank(group: ProcessGroup | None, rank_in_group: int) -> int:
    """The global rank of ``rank_in_group``: src/dst arguments of collectives are global ranks."""
    if group is None or not dist.is_initialized():
        return rank_in_group
    return dist.get_global_rank(group, rank_in_group)


# The one place that chooses ZeRO's collectives per backend: backend -> (world size, bucket bytes) ->
# method. Measured with tools/bench/bench_zero_collectives.py (gloo, fp32, quiet, two runs; no record kept,
# the notes are in git: git show af730fc:docs/benchmarks/ds-zero.md):
# - all-gather semantics: one async broadcast per owner beat all_gather, all_gather_into_tensor and an
#   all_reduce of a -0.0-filled buffer at 4-64 MiB at 2 and 4 ranks (53 MiB: 24.5 and 26.2 ms against
#   36-77 at 2 ranks; 52.0 and 44.9 against 120-137 at 4), and was within 3 ms of the best at 1 MiB;
# - reduce-scatter semantics: each rank sending the owners their slices (isend/irecv, the owner adds)
#   beat reduce_scatter_tensor, one reduce per owner and all_reduce at 2 ranks at 1-53 MiB in both runs
#   (53 MiB: 20.7 and 22.6 ms against 35-78) but not at 64 MiB (its receive buffer is then 32 MiB); at
#   4 ranks it won up to 4 MiB, tied at 16 and lost from 53 MiB to one reduce per owner.
# nccl (and any backend not listed) keeps its native collectives: reduce per owner and all_gather.
# Where a host transport qualifies (``_transport.py``: MPI under mpirun, else shared memory on one host), it
# carries CPU tensors instead, faster than any gloo method above.
MIB = 2**20


def _gloo_reduce(world: int, nbytes: int) -> str:
    return "send" if nbytes <= (56 * MIB if world == 2 else 4 * MIB) else "reduce"


GATHER_CHOICE: dict[str, Callable[[int, int], str]] = {"gloo": lambda world, nbytes: "broadcast"}
REDUCE_CHOICE: dict[str, Callable[[int, int], str]] = {"gloo": _gloo_reduce}


def gather_method(group: ProcessGroup | None, nbytes: int) -> str:
    """How ``all_gather_views`` moves ``nbytes`` on ``group``'s backend (``all_gather``, ``broadcast`` or ``all_reduce``)."""
    choose = GATHER_CHOICE.get(str(dist.get_backend(group)))
    return choose(group_size(group), nbytes) if choose is not None else "all_gather"


def reduce_method(group: ProcessGroup | None, nbytes: int, device: torch.device | None = None) -> str:
    """How ``reduce_to_owners`` sums a bucket of ``nbytes`` on ``device`` over ``group``'s backend (``reduce``,
    ``send`` or ``all_reduce``). gloo has no send/recv or reduce for CUDA tensors (only broadcast and
    all_reduce): there, on a device other than the CPU, every rank takes the whole sum by ``all_reduce``."""
    backend = str(dist.get_backend(group))
    if backend == "gloo" and device is not None and device.type != "cpu":
        return "all_reduce"
    choose = REDUCE_CHOICE.get(backend)
    return choose(group_size(group), nbytes) if choose is not None else "reduce"


def all_reduce_async(tensors: Sequence[torch.Tensor], group: ProcessGroup | None) -> list:
    """Launch a SUM all-reduce of each tensor in place; returns works to ``wait()`` (a host transport,
    ``_transport.py``, where one carries them)."""
    host = _transport.transport(group, *tensors) if tensors else None
    if host is not None:
        return [host.all_reduce(tensors)]
    return [dist.all_reduce(t, group=group, async_op=True) for t in tensors]


def broadcast_async(pieces: Sequence[tuple[torch.Tensor, int]], group: ProcessGroup | None) -> list:
    """Launch a broadcast of each ``(tensor, source rank in group)``; returns works to ``wait()``."""
    host = _transport.transport(group, *(t for t, _ in pieces)) if pieces else None
    if host is not None:
        return [host.broadcast(pieces)]
    return [dist.broadcast(t, src=global_rank(group, r), group=group, async_op=True) for t, r in pieces]


Segment = tuple[int, torch.Tensor]  # (offset in the flat space, 1-D tensor of that range)


class OwnerReduction:
    """One bucket summed across ranks, each slice to the rank that owns it (see ``reduce_to_owners``).

    After ``wait()``, ``owned`` holds this rank's summed pieces as ``(flat offset, 1-D tensor)``, in flat
    order (views of the caller's tensors, summed in place, or of a buffer made for the reduction).
    """

    def __init__(self, works: list, owned: list[Segment], finish: Callable[[], None] | None = None) -> None:
        self._works = works
        self._finish = finish
        self.owned = owned

    def wait(self) -> None:
        for w in self._works:
            w.wait()
        self._works = []
        if self._finish is not None:
            self._finish()
            self._finish = None


_next_tag = [0]  # point-to-point tags: every rank makes the same calls in the same order


def _tags(n: int) -> int:
    """The first of ``n`` consecutive tags for one reduction (the same on every rank): they cycle through
    2**24, far more than can be in flight at once."""
    base = _next_tag[0] if _next_tag[0] + n <= 1 << 24 else 0
    _next_tag[0] = base + n
    return base


def reduce_to_owners(
    segments: Sequence[Segment],
    layout: GroupLayout,
    start: int,
    end: int,
    group: ProcessGroup | None,
    method: str | None = None,
) -> OwnerReduction:
    """Sum the flat range ``[start, end)`` of ``layout`` across ranks, each slice to the rank that owns it.

    ``segments`` tile the range in order (one flat buffer, or one gradient per parameter); the caller
    may not read or free them before ``wait()``. Only the owned pieces are meaningful afterwards (the
    rest may hold anything). The method is ``reduce_method``'s: each rank sends the owners their pieces
    straight from the segments (``send``: nothing is flattened; the owner adds what it receives), or,
    on one flat buffer (the segments' own when there is one, else a copy), one async ``reduce`` per
    owner (owner ranges are unequal, which ``reduce_scatter_tensor`` does not take) or one all_reduce
    of the whole bucket. ``method`` overrides the choice (``reduce_scatter: false`` asks for all_reduce).
    """
    host = _transport.transport(group, *(t for _, t in segments)) if group_size(group) > 1 else None
    if host is not None and method in (None, "all_reduce"):
        return _host_to_owners(host, segments, layout, start, end, group, method == "all_reduce")
    method = method or reduce_method(
        group, (end - start) * segments[0][1].element_size(), segments[0][1].device
    )
    if method == "send" and group_size(group) > 1:
        return _send_to_owners(segments, layout, start, end, group)
    if len(segments) == 1:
        buf = segments[0][1]
    else:
        buf = flatten(
            [t for _, t in segments],
            [t.shape for _, t in segments],
            segments[0][1].dtype,
            segments[0][1].device,
        )
    rank = group_rank(group)
    owned = [(lo, buf[lo - start : hi - start]) for r, lo, hi in layout.owners(start, end) if r == rank]
    if group_size(group) == 1:  # a group of one (an expert held by one rank): the sum is the bucket itself
        return OwnerReduction([], owned)
    if method == "all_reduce":  # every rank ends with the whole sum; it reads its own slices
        return OwnerReduction([dist.all_reduce(buf, group=group, async_op=True)], owned)
    works = [
        dist.reduce(buf[lo - start : hi - start], dst=global_rank(group, r), group=group, async_op=True)
        for r, lo, hi in layout.owners(start, end)
    ]
    return OwnerReduction(works, owned)


def _host_to_owners(
    host: _transport.HostTransport,
    segments: Sequence[Segment],
    layout: GroupLayout,
    start: int,
    end: int,
    group: ProcessGroup | None,
    everyone: bool,
) -> OwnerReduction:
    """A host transport (MPI, shared memory): one in-place reduce per segment and owner, straight from the
    segments (nothing is flattened), or with ``everyone`` one in-place all-reduce per segment."""
    rank = group_rank(group)
    owned: list[Segment] = []
    pieces: list[tuple[torch.Tensor, int]] = []
    for r, lo, hi in layout.owners(start, end):
        for off, t in segments:
            a, z = max(lo, off), min(hi, off + t.numel())
            if a < z:
                pieces.append((t[a - off : z - off], r))
                if r == rank:
                    owned.append((a, t[a - off : z - off]))
    if everyone:
        return OwnerReduction([host.all_reduce([t for _, t in segments])], owned)
    return OwnerReduction([host.reduce(pieces, rank)], owned)


def _send_to_owners(
    segments: Sequence[Segment], layout: GroupLayout, start: int, end: int, group: ProcessGroup | None
) -> OwnerReduction:
    """Every rank sends each owner its pieces (one message per segment and owner, tagged by the segment);
    the owner receives the other ranks' pieces into one buffer and adds them into its own at ``wait()``."""
    rank, world = group_rank(group), group_size(group)
    base = _tags(len(segments))
    works: list = []
    owned: list[Segment] = []
    mine = [(lo, hi) for r, lo, hi in layout.owners(start, end) if r == rank]
    for r, lo, hi in layout.owners(start, end):
        for j, (off, t) in enumerate(segments):
            a, z = max(lo, off), min(hi, off + t.numel())
            if a >= z:
                continue
            if r == rank:
                owned.append((a, t[a - off : z - off]))
            else:
                works.append(
                    dist.isend(t[a - off : z - off], dst=global_rank(group, r), group=group, tag=base + j)
                )
    if not mine:
        return OwnerReduction(works, owned)
    lo, hi = mine[0]
    others = [q for q in range(world) if q != rank]
    inbox = torch.empty((len(others), hi - lo), dtype=segments[0][1].dtype, device=segments[0][1].device)
    for k, q in enumerate(others):
        for j, (off, t) in enumerate(segments):
            a, z = max(lo, off), min(hi, off + t.numel())
            if a < z:
                works.append(
                    dist.irecv(
                        inbox[k, a - lo : z - lo], src=global_rank(group, q), group=group, tag=base + j
                    )
                )

    def add_received() -> None:
        for a, piece in owned:
            for row in inbox:
                piece.add_(row[a - lo : a - lo + piece.numel()])

    return OwnerReduction(works, owned, add_received)


def all_gather_views(
    views: Sequence[torch.Tensor], rank: int, group: ProcessGroup | None, method: str | None = None
) -> None:
    """Fill ``views[r]`` on every rank with rank ``r``'s ``views[r]`` (equal sizes, one dtype).

    ``method`` (default: ``gather_method``'s choice): ``broadcast`` sends each owner's view with its own
    async broadcast, straight into every rank's view (nothing is copied); ``all_gather`` is the native
    collective; ``all_reduce`` sums a buffer holding this rank's slice and -0.0 everywhere else (exact bit
    for bit: ``x + -0.0 == x`` for every x, +0.0 included, where ``+0.0`` would turn a -0.0 weight into
    +0.0); when the views lie back to back in one tensor that tensor is the buffer.
    """
    host = _transport.transport(group, *views) if group_size(group) > 1 else None
    if host is not None:  # one all-gather where the views tile one span, else a broadcast each
        span = _back_to_back(views) if method != "broadcast" else None
        if span is not None and len({v.numel() for v in views}) == 1:
            host.all_gather(span).wait()
        else:
            host.broadcast([(v, r) for r, v in enumerate(views)]).wait()
        return
    nbytes = sum(v.numel() for v in views) * views[rank].element_size()
    method = method or gather_method(group, nbytes)
    if method == "broadcast":
        works = [
            dist.broadcast(v, src=global_rank(group, r), group=group, async_op=True)
            for r, v in enumerate(views)
        ]
        for w in works:
            w.wait()
        return
    if method == "all_gather":
        dist.all_gather(list(views), views[rank].clone(), group=group)
        return
    span = _back_to_back(views)
    if span is not None:
        for r, v in enumerate(views):
            if r != rank:
                v.fill_(-0.0)
        dist.all_reduce(span, group=group)
        return
    n = views[rank].numel()
    buf = torch.full((len(views) * n,), -0.0, dtype=views[rank].dtype, device=views[rank].device)
    buf[rank * n : (rank + 1) * n].copy_(views[rank].reshape(-1))
    dist.all_reduce(buf, group=group)
    for r, v in enumerate(views):
        if r != rank:
            v.copy_(buf[r * n : (r + 1) * n].view_as(v))


def _back_to_back(views: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The 1-D tensor the contiguous ``views`` tile in order, or None when they do not."""
    first = views[0]
    if not all(v.dim() == 1 and v.is_contiguous() and v.dtype == first.dtype for v in views):
        return None
    size = first.element_size()
    for a, b in zip(views, views[1:]):
        if b.data_ptr() != a.data_ptr() + a.numel() * size or b.untyped_storage().data_ptr() != (
            first.untyped_storage().data_ptr()
        ):
            return None
    offset = first.storage_offset()
    total = sum(v.numel() for v in views)
    return first.as_strided((total,), (1,), offset)


def flatten(
    tensors: Sequence[torch.Tensor | None],
    shapes: Sequence[torch.Size],
    dtype: torch.dtype,
    device: torch.device,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Concatenate tensors into one 1-D tensor, writing zeros where a tensor is None."""
    total = sum(int(torch.Size(s).numel()) for s in shapes)
    flat = out if out is not None else torch.empty(total, dtype=dtype, device=device)
    offset = 0
    for t, s in zip(tensors, shapes):
        n = int(torch.Size(s).numel())
        if t is None:
            flat[offset : offset + n].zero_()
        else:
            flat[offset : offset + n].copy_(t.reshape(-1))
        offset += n
    return flat

"""Collective helpers shared by stage 0 and ZeRO: averaging rule, bucket planning, rank mapping, and the
choice of collective per backend (the one place that chooses)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from ._layout import GroupLayout

ProcessGroup = dist.ProcessGroup


@dataclass(frozen=True)
class AveragingRule:
    """How a bucket is scaled around its SUM reduction (spec section 5).

    postscale (default): ``t *= 1/predivide`` -> SUM -> ``t *= predivide/dp``.
    prescale: ``t *= 1/dp`` -> SUM (``predivide`` is ignored, as in DeepSpeed).
    """

    dp: int
    prescale: bool = False
    predivide: float = 1.0

    def before(self, t: torch.Tensor) -> None:
        """Scale a bucket in place before it is summed across ranks."""
        if self.prescale:
            if self.dp != 1:
                t.mul_(1.0 / self.dp)
        elif self.predivide != 1.0:
            t.mul_(1.0 / self.predivide)

    def after_factor(self) -> float:
        """The factor applied to the summed bucket (1.0 when nothing is left to do)."""
        if self.prescale or self.predivide == self.dp:
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


# The one place that chooses ZeRO's collectives per backend: backend -> bucket bytes from which an
# all_reduce (same result) replaces the native collective. Measured with tools/bench_zero_collectives.py
# (gloo, fp32; docs/benchmarks/ds-zero.md): gloo's all_gather is slower than an all_reduce of a full
# buffer for large buckets only; one reduce per owner moves half the bytes of an all_reduce at 2 ranks
# and measured faster from 4 MiB up, so no backend's reduce-scatter is replaced. nccl (and any backend
# not listed) keeps its native collectives.
REDUCE_SCATTER_BY_ALL_REDUCE: dict[str, int] = {}
ALL_GATHER_BY_ALL_REDUCE: dict[str, int] = {"gloo": 32 * 2**20}


def by_all_reduce(table: dict[str, int], group: ProcessGroup | None, nbytes: int) -> bool:
    """Does ``table`` (one of the two above) say to use an all_reduce for ``nbytes`` on ``group``'s backend?"""
    threshold = table.get(str(dist.get_backend(group)))
    return threshold is not None and nbytes >= threshold


def reduce_to_owners(
    buf: torch.Tensor, layout: GroupLayout, start: int, end: int, group: ProcessGroup | None
) -> list:
    """Sum ``buf`` (the flat range ``[start, end)`` of ``layout``) across ranks, each slice to its owner.

    Only the owner's slice is meaningful afterwards (the rest of ``buf`` may hold anything). Where
    ``REDUCE_SCATTER_BY_ALL_REDUCE`` says so, one all_reduce of the whole bucket (which every rank
    already holds, so it costs no memory); else one async ``reduce`` per owner (owner ranges are
    unequal, which ``reduce_scatter_tensor`` does not take). Returns the works to wait for.
    """
    if by_all_reduce(REDUCE_SCATTER_BY_ALL_REDUCE, group, buf.numel() * buf.element_size()):
        return [dist.all_reduce(buf, group=group, async_op=True)]
    return [
        dist.reduce(buf[lo - start : hi - start], dst=global_rank(group, r), group=group, async_op=True)
        for r, lo, hi in layout.owners(start, end)
    ]


def all_gather_views(views: Sequence[torch.Tensor], rank: int, group: ProcessGroup | None) -> None:
    """Fill ``views[r]`` on every rank with rank ``r``'s ``views[r]`` (equal sizes, one dtype).

    Where ``ALL_GATHER_BY_ALL_REDUCE`` says so: an all_reduce (SUM) of a buffer holding this rank's
    slice and -0.0 everywhere else. Exact bit for bit: ``x + -0.0 == x`` for every x, +0.0 included
    (``+0.0`` would turn a -0.0 weight into +0.0). When the views lie back to back in one tensor (a
    gather bucket covering whole partitions) that tensor is the buffer, so nothing is copied.
    """
    nbytes = sum(v.numel() for v in views) * views[rank].element_size()
    if not by_all_reduce(ALL_GATHER_BY_ALL_REDUCE, group, nbytes):
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

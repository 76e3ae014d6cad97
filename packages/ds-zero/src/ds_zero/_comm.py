"""Collective helpers shared by stage 0 and ZeRO: averaging rule, bucket planning, rank mapping."""

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


def reduce_to_owners(
    buf: torch.Tensor, layout: GroupLayout, start: int, end: int, group: ProcessGroup | None
) -> list:
    """Sum ``buf`` (the flat range ``[start, end)`` of ``layout``) across ranks, each slice to its owner.

    One async ``reduce`` per owner (ZeRO 2 and ZeRO 3): on gloo this measured faster than
    ``reduce_scatter_tensor`` (which also needs equal, padded chunks) at every bucket size, and faster
    than an all-reduce from 4 MiB up (docs/benchmarks/ds-zero.md). Returns the works to wait for.
    """
    return [
        dist.reduce(buf[lo - start : hi - start], dst=global_rank(group, r), group=group, async_op=True)
        for r, lo, hi in layout.owners(start, end)
    ]


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

"""Stage 3 gradient reduction: each full gradient is summed into its owners' partition gradients.

This is the one place that schedules stage-3 reductions, so it can later be pointed at the bucket
scheduler shared with stages 0-2. Buckets are planned once, in reverse flat order (the order backward
tends to produce gradients), and launch in that fixed order on every rank when all their gradients
arrived; what is left launches at ``flush()``. A gradient that arrives for a bucket already sent (a
parameter used in two checkpointed segments) is reduced at ``flush()`` on its own, in flat order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .._comm import AveragingRule, global_rank, plan_buckets
from ._partition import ParamSlot, PartitionedParams

__all__ = ["GradScheduler"]


@dataclass(eq=False)
class _Bucket:
    order: int
    group: int
    start: int  # flat range [start, end) of its consecutive parameters
    end: int
    count: int  # parameters in the bucket
    pending: int = 0
    buf: torch.Tensor | None = None
    works: list = field(default_factory=list)
    launched: bool = False


class GradScheduler:
    """Turns full gradients into this rank's summed (averaged) partition gradients ``grad_parts``."""

    def __init__(
        self,
        params: PartitionedParams,
        grad_parts: list[torch.Tensor],
        *,
        bucket_elems: int,
        rule: AveragingRule,
        overlap_comm: bool,
    ) -> None:
        self.params = params
        self.grad_parts = grad_parts
        self.rule = rule
        self.max_inflight = 2 if overlap_comm else 1
        self.reduce_calls = 0  # collectives issued (observed by the tests)
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        by_group: dict[int, list[ParamSlot]] = {}
        for s in params.slots.values():
            if s.param.requires_grad:
                by_group.setdefault(s.group, []).append(s)
        for g in sorted(by_group, reverse=True):
            slots = sorted(by_group[g], key=lambda s: s.start, reverse=True)
            for idx in plan_buckets([s.numel for s in slots], bucket_elems):
                members = [slots[i] for i in idx]
                b = _Bucket(
                    len(self._buckets), g, members[-1].start, members[0].end, len(members), len(members)
                )
                self._buckets.append(b)
                for s in members:
                    self._bucket_of[id(s)] = b
        self._next = 0
        self._inflight: list[_Bucket] = []
        self._late: dict[int, tuple[ParamSlot, torch.Tensor]] = {}

    def add(self, slot: ParamSlot, grad: torch.Tensor) -> None:
        """A parameter's full gradient is final for this backward: stage it in its bucket."""
        b = self._bucket_of[id(slot)]
        if b.launched:
            prev = self._late.get(id(slot))
            late = grad.detach().reshape(-1).clone() if prev is None else prev[1].add_(grad.reshape(-1))
            self._late[id(slot)] = (slot, late)
            return
        if b.buf is None:
            b.buf = torch.zeros(b.end - b.start, dtype=grad.dtype, device=grad.device)
        b.buf[slot.start - b.start : slot.end - b.start].add_(grad.reshape(-1))
        b.pending -= 1
        while self._next < len(self._buckets) and self._buckets[self._next].pending <= 0:
            self._launch(self._buckets[self._next])

    def flush(self) -> None:
        """End of a backward: send every bucket not yet sent (zeros for missing gradients) and wait."""
        while self._next < len(self._buckets):
            self._launch(self._buckets[self._next])
        for slot, grad in sorted(self._late.values(), key=lambda item: (item[0].group, item[0].start)):
            late = _Bucket(-1, slot.group, slot.start, slot.end, 1, 0, grad)
            self._send(late)
        while self._inflight:
            self._absorb(self._inflight[0])
        self._late.clear()
        self._next = 0
        for b in self._buckets:
            b.pending, b.launched = b.count, False

    def _launch(self, b: _Bucket) -> None:
        if b.buf is None:  # no parameter of the bucket got a gradient: the owners still expect a sum
            dtype = self.params.parts[b.group].dtype
            b.buf = torch.zeros(b.end - b.start, dtype=dtype, device=self.grad_parts[b.group].device)
        b.launched = True
        self._next = b.order + 1
        self._send(b)

    def _send(self, b: _Bucket) -> None:
        """Reduce each owner's slice of the bucket to that owner (faster than reduce_scatter on gloo)."""
        self.rule.before(b.buf)
        pg = self.params.process_group
        if self.params.dp > 1:
            layout = self.params.layouts[b.group]
            b.works = [
                dist.reduce(
                    b.buf[lo - b.start : hi - b.start], dst=global_rank(pg, r), group=pg, async_op=True
                )
                for r, lo, hi in layout.owners(b.start, b.end)
            ]
            self.reduce_calls += len(b.works)
        self._inflight.append(b)
        while len(self._inflight) >= self.max_inflight + 1 or (self.max_inflight == 1 and self._inflight):
            self._absorb(self._inflight[0])

    def _absorb(self, b: _Bucket) -> None:
        """Wait for a bucket and add the owned slice into this rank's partition gradient."""
        for w in b.works:
            w.wait()
        layout = self.params.layouts[b.group]
        ps, pe = layout.partition_range(self.params.rank)
        lo, hi = max(b.start, ps), min(b.end, pe)
        if lo < hi:
            target = self.grad_parts[b.group]  # in CPU memory with offload_param
            target[lo - ps : hi - ps].add_(
                b.buf[lo - b.start : hi - b.start].to(target.device), alpha=self.rule.after_factor()
            )
        self._inflight.remove(b)
        b.buf, b.works = None, []

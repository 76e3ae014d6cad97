"""Stage 3 gradient reduction: each full gradient is summed into its owners' partition gradients.

*When* a bucket is sent is :class:`~ds_zero._schedule.BucketSchedule`'s, the scheduler of stages 0-2:
buckets are planned once, in reverse flat order (the order backward tends to produce gradients), and
launch in that fixed order on every rank once all their gradients arrived; what is left launches at
``flush()``. What is stage-3 specific lives here: staging a full gradient into its bucket's buffer (the
parameter is released right after), one ``dist.reduce`` per owner of a slice of the bucket, adding the
owned slice into the partition gradient, and gradients that arrive for a bucket already sent (a
parameter used in two checkpointed segments), reduced at ``flush()`` on their own, in flat order.

A bucket's buffer lives from its first gradient to its reduction. One of at most ``KEEP_BYTES`` is kept
for the next bucket (zeroed, not allocated again): a fresh one cost the page faults of its whole size every
backward, a large part of a small model's step (the Trainer's GPT-2 of docs/benchmarks.md: one 13 MB
bucket), while a large model's buckets (DeepSpeed's default is 500M elements) are freed as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .._comm import AveragingRule, plan_buckets, reduce_to_owners
from .._schedule import BucketSchedule
from ._grad_parts import GradPartitions
from ._partition import ParamSlot, PartitionedParams
from ._zeropp import HostGroups, QuantizedReduction

__all__ = ["KEEP_BYTES", "Stage3Reducer"]

KEEP_BYTES = 64 << 20  # bucket buffers up to this size in all are kept for reuse (the heap trim's bound)


@dataclass(eq=False)
class _Bucket:
    group: int
    start: int  # flat range [start, end) of its consecutive parameters
    end: int
    buf: torch.Tensor | None = None
    works: list = field(default_factory=list)


class Stage3Reducer:
    """Turns full gradients into this rank's summed (averaged) partition gradients ``grad_parts``
    (allocated by the first reduction of a backward, see ``_grad_parts``).

    The gather hooks call ``grad_ready(param)`` while ``param.grad`` holds its full gradient; ``flush()``
    ends a backward. With ``overlap_comm`` up to two buckets are in flight while backward goes on;
    without it each bucket's reduction completes before backward continues.
    """

    def __init__(
        self,
        params: PartitionedParams,
        grad_parts: GradPartitions,
        *,
        bucket_elems: int,
        rule: AveragingRule,
        overlap_comm: bool,
        quantized: HostGroups | None = None,
    ) -> None:
        self.params = params
        self.quantized = quantized  # zero_quantized_gradients: qgZ's 4-bit all-to-alls (``_zeropp``)
        self.grad_parts = grad_parts
        self.rule = rule
        self.max_inflight = 2 if overlap_comm else 0  # buckets left in flight after a launch
        self.reduce_calls = 0  # bucket reductions issued (observed by the tests)
        self.peak_inflight = 0  # most buckets left in flight by a launch (observed by the tests)
        self._buckets: list[_Bucket] = []
        members_of: list[list[nn.Parameter]] = []
        by_group: dict[int, list[ParamSlot]] = {}
        for s in params.slots.values():
            if s.param.requires_grad:
                by_group.setdefault(s.group, []).append(s)
        for g in sorted(by_group, reverse=True):
            slots = sorted(by_group[g], key=lambda s: s.start, reverse=True)
            for idx in plan_buckets([s.numel for s in slots], bucket_elems):
                members = [slots[i] for i in idx]
                self._buckets.append(_Bucket(g, members[-1].start, members[0].end))
                members_of.append([s.param for s in members])
        self._bucket_of = {id(p): k for k, members in enumerate(members_of) for p in members}
        self.schedule = BucketSchedule(members_of, self._launch, self._stage, hooks=False)
        # Armed for good: a stage-3 gradient cannot wait in .grad for a later backward (the parameter is
        # released when it arrives), so every gradient is reduced, whichever backward produced it.
        self.schedule.arm(launch_early=True)
        self._inflight: list[_Bucket] = []
        self._spare: list[torch.Tensor] = []  # bucket buffers kept for reuse (KEEP_BYTES in all)
        self.buffers_allocated = 0  # bucket buffers allocated (observed by the tests)
        self._late: dict[int, tuple[ParamSlot, torch.Tensor]] = {}

    def grad_ready(self, param: nn.Parameter) -> None:
        """``param.grad`` is ``param``'s full gradient for this backward (the caller frees it afterwards)."""
        self.schedule.ready(param)

    def flush(self) -> None:
        """End of a backward: send every bucket not yet sent (zeros for missing gradients) and wait."""
        self.schedule.launch_rest()
        for slot, grad in sorted(self._late.values(), key=lambda item: (item[0].group, item[0].start)):
            self._send(_Bucket(slot.group, slot.start, slot.end, grad))
        while self._inflight:
            self._absorb(self._inflight[0])
        self.grad_parts.finish()
        self._late.clear()
        self.schedule.reset()

    def _stage(self, param: nn.Parameter) -> None:
        """Add the gradient into its bucket's buffer, or keep it aside when that bucket was already sent."""
        if param.grad is None:
            return
        grad = param.grad.reshape(-1)
        slot = self.params.slot(param)
        k = self._bucket_of[id(param)]
        if k < self.schedule.next:  # late: its bucket is on the wire
            prev = self._late.get(id(slot))
            self._late[id(slot)] = (slot, grad.detach().clone() if prev is None else prev[1].add_(grad))
            return
        b = self._buckets[k]
        if b.buf is None:
            b.buf = self._buffer(b.end - b.start, grad.dtype, grad.device)
        b.buf[slot.start - b.start : slot.end - b.start].add_(grad)

    def _launch(self, k: int) -> None:
        b = self._buckets[k]
        if b.buf is None:  # no parameter of the bucket got a gradient: the owners still expect a sum
            dtype = self.params.part_dtypes[b.group]
            b.buf = self._buffer(b.end - b.start, dtype, self.params.compute_devices[b.group])
        self._send(b)

    def _send(self, b: _Bucket) -> None:
        """Reduce each owner's slice of the bucket to that owner; at most ``max_inflight`` stay in flight."""
        self.rule.before(b.buf)
        if self.params.dp > 1:
            layout = self.params.layouts[b.group]
            if self.quantized is not None:
                q = QuantizedReduction(b.buf, layout, b.start, b.end, self.quantized, self.params.rank)
                b.works = [q]
            else:
                b.works = [
                    reduce_to_owners([(b.start, b.buf)], layout, b.start, b.end, self.params.process_group)
                ]
            self.reduce_calls += 1
        self._inflight.append(b)
        while len(self._inflight) > self.max_inflight:
            self._absorb(self._inflight[0])
        self.peak_inflight = max(self.peak_inflight, len(self._inflight))

    def _absorb(self, b: _Bucket) -> None:
        """Wait for a bucket and add the owned slice into this rank's partition gradient."""
        for w in b.works:
            w.wait()
        layout = self.params.layouts[b.group]
        ps, pe = layout.partition_range(self.params.rank)
        lo, hi = max(b.start, ps), min(b.end, pe)
        if lo < hi:  # the partition is in CPU memory with offload_param
            self.grad_parts.add(
                b.group, lo - ps, hi - ps, b.buf[lo - b.start : hi - b.start], self.rule.after_factor()
            )
        self._inflight.remove(b)
        self._keep(b.buf)
        b.buf, b.works = None, []

    def _buffer(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A zeroed flat buffer: a kept one that is large enough, else a new one."""
        for i, t in enumerate(self._spare):
            if t.dtype == dtype and t.device == device and t.numel() >= numel:
                return self._spare.pop(i)[:numel].zero_()
        self.buffers_allocated += 1
        return torch.zeros(numel, dtype=dtype, device=device)

    def _keep(self, buf: torch.Tensor) -> None:
        """Keep a reduced bucket's buffer for reuse while the kept ones stay within ``KEEP_BYTES``."""
        whole = buf if buf._base is None else buf._base
        kept = sum(t.numel() * t.element_size() for t in self._spare)
        if whole.dim() == 1 and kept + whole.numel() * whole.element_size() <= KEEP_BYTES:
            self._spare.append(whole)

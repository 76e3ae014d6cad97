"""ZeRO 1/2 gradient reduction: buckets of flat ranges, each slice summed to the rank that owns it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ._comm import AveragingRule, OwnerReduction, ProcessGroup, Segment, plan_buckets, reduce_to_owners
from ._options import ZeroOptions
from ._partition import FlatGroup
from ._schedule import BucketSchedule
from ._weak_hook import weak_post_accumulate_grad_hook

__all__ = ["PartitionReducer"]


@dataclass
class _Bucket:
    """Consecutive parameters of one group reduced together; ``[start, end)`` in the flat space."""

    order: int
    group: FlatGroup
    indices: list[int]
    start: int
    end: int
    staged: set[int] = field(default_factory=set)
    segments: list[Segment] = field(default_factory=list)  # what is being reduced: kept alive until absorbed
    reduction: OwnerReduction | None = None


class PartitionReducer:
    """Reduce each bucket's gradients so every rank ends with the average of its own partition.

    Stage 1 keeps full local gradients until the boundary and reduces them there (from the boundary
    backward's hooks with ``overlap_comm``); stage 2 reduces bucket by bucket in every micro-step's
    backward and frees the gradients at once, keeping only the rank's slice (``FlatGroup.grad_part``).
    Launch order and hooks are :class:`BucketSchedule`'s, shared with stage 0.

    ``contiguous_gradients`` at stage 2 stages gradients into preallocated bucket-sized buffers as
    they arrive (two with ``overlap_comm``: one fills while the other is in flight).
    """

    def __init__(
        self, groups: list[FlatGroup], opts: ZeroOptions, rule: AveragingRule, group: ProcessGroup | None
    ) -> None:
        self.groups = groups
        self.opts = opts
        self.rule = rule
        self.process_group = group
        self.stage = opts.stage
        self.contiguous = opts.contiguous_gradients or opts.cpu_offload  # offload wants them in one place
        self.fp32_accum = any(g.grad_dtype != g.flat.dtype for g in groups)
        self.buckets = self._plan()
        self._bucket_of = {id(b.group.params[i]): (b, i) for b in self.buckets for i in b.indices}
        self._nslots = 2 if opts.overlap_comm else 1
        # contiguous stage 2's staging slots: allocated by a backward's first staged gradient and freed
        # when that backward's reductions are done, so that nothing bucket-sized lives between backwards
        self._slots: list[torch.Tensor] = []
        self._slot_numel = max((b.end - b.start for b in self.buckets), default=0)
        self._slot_owner: list[_Bucket | None] = [None] * self._nslots
        self._inflight: list[_Bucket] = []
        self._stream = None
        self.got_grad: set[int] = set()  # ids of params that received a gradient in this engine's backward
        self.outside: dict[int, nn.Parameter] = {}  # params that received one outside it since
        self.schedule = BucketSchedule(
            [[b.group.params[i] for i in b.indices] for b in self.buckets], self._launch_k, self._on_grad
        )
        # a second hook notes gradients that arrive while the schedule is not armed (outside our backward)
        self._watch = [
            weak_post_accumulate_grad_hook(b.group.params[i], self._watch_outside)
            for b in self.buckets
            for i in b.indices
        ]

    def _plan(self) -> list[_Bucket]:
        """Static buckets in reverse parameter order (the order backward tends to produce grads)."""
        buckets: list[_Bucket] = []
        for g in reversed(self.groups):
            order = list(range(len(g.params)))[::-1]
            for idx in plan_buckets([g.params[i].numel() for i in order], self.opts.reduce_bucket_size):
                members = [order[j] for j in idx]
                start = g.layout.param_range(min(members))[0]
                end = g.layout.param_range(max(members))[1]
                buckets.append(_Bucket(len(buckets), g, members, start, end))
        return buckets

    @property
    def staging_buffers(self) -> list[torch.Tensor]:
        """The bucket buffers of contiguous stage 2 (empty between backwards: they are freed by flush)."""
        return self._slots

    def _slot(self, bucket: _Bucket) -> torch.Tensor:
        """``bucket``'s staging slot, allocating the slots at the first use since the last flush.

        Uninitialised memory is enough: every element of a bucket's range is written (a gradient or
        zeros, ``_stage2_buffer``) before the bucket is reduced, and the flat space has no gaps.
        """
        if not self._slots:
            flat = self.buckets[0].group.flat
            self._slots = [
                torch.empty(self._slot_numel, dtype=flat.dtype, device=flat.device)
                for _ in range(self._nslots)
            ]
        return self._slots[bucket.order % self._nslots]

    # ------------------------------------------------------------------ the engine's backward
    def begin_backward(self, boundary: bool) -> None:
        """Hooks act from now on; they launch reductions at stage 2, and at stage 1's boundary with overlap."""
        self.outside.clear()  # grads that arrived before this backward accumulate with it, as at stage 0
        self.schedule.arm(self.stage == 2 or (boundary and self.opts.overlap_comm))

    def end_backward(self) -> None:
        """Hooks stop acting; stage 2 reduces what is left of this micro-step and waits for all of it."""
        self.schedule.disarm()
        if self.stage == 2:
            self.flush()

    def flush(self) -> None:
        """Launch every bucket not launched yet, wait for all, and start a new round."""
        self.schedule.launch_rest()
        while self._inflight:
            self._absorb(self._inflight[0])
        self.schedule.reset()
        for b in self.buckets:
            b.staged = set()
        self._slots = []  # every reduction is done: the staging slots are not read again

    def _watch_outside(self, param: nn.Parameter) -> None:
        if not self.schedule.armed:
            self.outside[id(param)] = param

    def _on_grad(self, param: nn.Parameter) -> None:
        self.got_grad.add(id(param))
        bucket, index = self._bucket_of[id(param)]
        if self.stage == 1:
            if self.fp32_accum:
                self._adopt_grad(bucket.group, index)  # bf16 grad -> fp32 buffer, freed at once
            return
        if self.contiguous and param.grad is not None and self._claim_slot(bucket):
            slot = self._slot(bucket)
            start, end = bucket.group.layout.param_range(index)
            slot[start - bucket.start : end - bucket.start].copy_(param.grad.reshape(-1))
            param.grad = None  # the slot holds it now: free the tensor autograd allocated
            bucket.staged.add(index)

    # ------------------------------------------------------------------ buckets
    def _claim_slot(self, bucket: _Bucket) -> bool:
        """Reserve the staging slot of ``bucket``, unless it is still needed by a bucket not yet launched.

        Only the next ``nslots`` buckets in launch order may stage; an earlier bucket still in flight
        on the same slot is waited for first.
        """
        if bucket.order >= self.schedule.next + self._nslots:
            return False
        s = bucket.order % self._nslots
        owner = self._slot_owner[s]
        if owner is bucket:
            return True
        if owner is not None:
            self._absorb(owner)  # launched earlier (launch order), so waiting cannot deadlock
        self._slot_owner[s] = bucket
        return True

    def _launch_k(self, k: int) -> None:
        b = self.buckets[k]
        g = b.group
        b.segments = self._stage1_segments(b) if self.stage == 1 else self._stage2_segments(b)
        stream = self._side_stream(g.flat.device)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(g.flat.device))
            with torch.cuda.stream(stream):
                b.reduction = self._reduce_range(g, b.segments, b.start, b.end)
        else:
            b.reduction = self._reduce_range(g, b.segments, b.start, b.end)
        self._inflight.append(b)
        if self.stage == 2 and not self.opts.overlap_comm:
            self._absorb(b)  # without overlap_comm each reduction completes before backward goes on

    def _stage2_segments(self, b: _Bucket) -> list[Segment]:
        """The bucket's gradients: one staging slot with contiguous_gradients, else the gradients themselves
        (the reduction flattens them only if its collective needs one buffer). ``.grad`` is cleared: the
        bucket holds them until its reduction is absorbed."""
        g = b.group
        if self.contiguous:
            self._claim_slot(b)
            buf = self._slot(b)[: b.end - b.start]
            for i in b.indices:
                if i not in b.staged:
                    start, end = g.layout.param_range(i)
                    grad = g.params[i].grad
                    target = buf[start - b.start : end - b.start]
                    target.zero_() if grad is None else target.copy_(grad.reshape(-1))
            segments = [(b.start, buf)]
        else:
            segments = self._grad_segments(b)
        for i in b.indices:
            g.params[i].grad = None  # stage 2 keeps only its partition's slice
        return segments

    def _stage1_segments(self, b: _Bucket) -> list[Segment]:
        """The bucket's accumulated full gradients: a view of the flat gradient buffer, or the gradients."""
        g = b.group
        if g.flat_grad_dtype is None:
            return self._grad_segments(b)
        for i in b.indices:
            self._adopt_grad(g, i)
        return [(b.start, g.flat_grad_for_window()[b.start : b.end])]

    def _grad_segments(self, b: _Bucket) -> list[Segment]:
        """``(flat offset, 1-D gradient)`` of each parameter of the bucket in flat order (zeros for none)."""
        g = b.group
        out = []
        for i in sorted(b.indices):
            p, (start, _) = g.params[i], g.layout.param_range(i)
            grad = (
                p.grad.reshape(-1)
                if p.grad is not None
                else torch.zeros(p.numel(), dtype=g.flat.dtype, device=g.flat.device)
            )
            out.append((start, grad.to(g.flat.device, g.flat.dtype)))
        return out

    def _adopt_grad(self, g: FlatGroup, i: int) -> None:
        """Make the flat gradient buffer hold parameter ``i``'s gradient when ``.grad`` is not a view of it.

        With fp32 accumulation the low-precision grad is added into the fp32 buffer and freed. Otherwise
        ``.grad`` is normally the view; a script that replaced it (``module.zero_grad()`` sets it to None,
        and autograd then allocates a new one) gets what is in ``.grad`` now, as stage 0 would.
        """
        p = g.params[i]
        start, end = g.layout.param_range(i)
        view = g.flat_grad_for_window()[start:end]
        if self.fp32_accum:
            if p.grad is not None:
                view.add_(p.grad.reshape(-1))
                p.grad = None
            return
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr():
            view.copy_(p.grad.reshape(-1))
            p.grad = view.view_as(p)

    def _reduce_range(self, g: FlatGroup, segments: list[Segment], start: int, end: int) -> OwnerReduction:
        """Sum ``segments`` (flat range ``[start, end)``) across ranks: each slice to its owner, or to all."""
        for _, t in segments:
            self.rule.before(t)
        method = None if self.opts.reduce_scatter else "all_reduce"
        return reduce_to_owners(segments, g.layout, start, end, g.process_group, method)

    def _absorb(self, b: _Bucket) -> None:
        """Wait for a bucket's reduction and add this rank's slice into its partition gradient."""
        b.reduction.wait()
        if self._stream is not None:
            torch.cuda.current_stream(b.group.flat.device).wait_stream(self._stream)
        g = b.group
        ps, _ = g.partition
        for lo, summed in b.reduction.owned:
            part = g.grad_part_for_update()
            part[lo - ps : lo - ps + summed.numel()].add_(summed, alpha=self.rule.after_factor())
        self._inflight.remove(b)
        b.segments, b.reduction = [], None
        s = b.order % self._nslots
        if self._slot_owner[s] is b:
            self._slot_owner[s] = None

    def _side_stream(self, device: torch.device):
        if not (self.opts.overlap_comm and device.type == "cuda"):
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=device)
        return self._stream

    def remove_hooks(self) -> None:
        """Detach the gradient hooks."""
        self.schedule.remove_hooks()
        for h in self._watch:
            h.remove()
        self._watch = []

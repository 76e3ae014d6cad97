"""The fetch schedule: which gathers to issue early and which gathered parameters to keep.

The first micro-step records the order in which modules fetch their parameters (forward and backward);
later micro-steps follow that trace and use it for DeepSpeed's three stage-3 memory/speed knobs:

* ``stage3_prefetch_bucket_size``: after a module's fetch, the next modules' parameters (up to that many
  elements) are gathered with ``async_op`` broadcasts, which run while the current module computes.
* ``stage3_max_reuse_distance``: a module done with a parameter keeps it whole when the trace says it is
  fetched again within that many elements of fetches (the last layers between forward and backward);
  otherwise it is released.
* ``stage3_max_live_parameters``: prefetching stops at that many live gathered elements, and parameters
  kept for reuse are released (furthest next use first) when a fetch takes the live set beyond it.

A micro-step whose fetches differ from the trace stops following it and the next one records anew. Every
rank runs the same module order, so every rank issues the same collectives in the same order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from ._partition import ParamSlot, PartitionedParams

__all__ = ["FetchSchedule"]


class FetchSchedule:
    """Fetches and releases on behalf of the gather hooks, following the recorded module order."""

    def __init__(
        self, params: PartitionedParams, *, prefetch_bucket_size: int, max_live: int, max_reuse_distance: int
    ) -> None:
        self.params = params
        self.prefetch_bucket_size = prefetch_bucket_size
        self.max_live = max_live
        self.max_reuse_distance = max_reuse_distance
        self._recording: list[list[ParamSlot]] | None = []  # None: not recording (following or diverged)
        self._trace: list[list[ParamSlot]] | None = None
        self._cursor = 0  # index in the trace of the next expected fetch
        self._ahead = 0  # trace events before this one hold nothing left to prefetch (each fetch scans on)
        self._cum: list[int] = []  # elements fetched before trace event i
        self._uses: dict[int, list[int]] = {}  # id(slot) -> trace events that fetch it
        self._kept: dict[int, ParamSlot] = {}  # released by their users but kept whole for reuse
        self.prefetch_calls = 0  # async gathers issued ahead of use (observed by the tests)

    # ------------------------------------------------------------------ called by the hooks
    def fetch(self, slots: list[ParamSlot]) -> None:
        """Make ``slots`` whole for a module about to run, then prefetch what the trace says comes next."""
        for s in slots:
            self._kept.pop(id(s), None)
        self.params.gather(slots)
        if self._recording is not None:
            self._recording.append(slots)
            return
        if self._trace is None:
            return
        if self._cursor >= len(self._trace) or self._trace[self._cursor] != slots:
            # the module order changed (an eval forward, data-dependent control flow): stop following,
            # drop what was kept on the trace's word, record the next micro-step
            self._trace = None
            self._ahead = 0
            kept, self._kept = list(self._kept.values()), {}
            self.params.release(kept)
            if self.params.swap is not None:
                self.params.swap.drop_ahead()
            return
        self._cursor += 1
        self._limit_live()
        self._prefetch()

    def release(self, slots: Iterable[ParamSlot]) -> None:
        """The callers are done with ``slots``: release them, except those reused soon (see the module doc)."""
        free = []
        for s in slots:
            if self._reuse_distance(s) <= self.max_reuse_distance:
                self._kept[id(s)] = s
            else:
                free.append(s)
        self._released(free)

    def release_all(self) -> None:
        """Release every whole parameter no module is using, those kept for reuse included."""
        self._kept.clear()
        self.params.release(self.params.slots.values())

    def end_micro_step(self) -> None:
        """After a backward: a recording becomes the trace; the next micro-step follows it from the start."""
        if self._recording is not None:
            self._set_trace(self._recording)
            self._recording = None
        elif self._trace is None:
            self._recording = []
        self._cursor = self._ahead = 0
        self._kept.clear()  # the caller releases every parameter now
        if self.params.swap is not None:
            self.params.swap.drop_ahead()

    # ------------------------------------------------------------------ the trace
    def _set_trace(self, trace: list[list[ParamSlot]]) -> None:
        self._trace, self._cum, self._uses = trace, [0], {}
        for i, event in enumerate(trace):
            self._cum.append(self._cum[-1] + sum(s.numel for s in event))
            for s in event:
                self._uses.setdefault(id(s), []).append(i)

    def _released(self, slots: list[ParamSlot]) -> None:
        """Release ``slots``; a later prefetch scan looks again from the next event that fetches one."""
        self.params.release(slots)
        if self._trace is None or self._recording is not None:
            return
        for s in slots:
            if not s.gathered:
                uses = self._uses.get(id(s), [])
                j = bisect.bisect_left(uses, self._cursor)
                if j < len(uses):
                    self._ahead = min(self._ahead, uses[j])

    def _reuse_distance(self, slot: ParamSlot) -> float:
        """Elements fetched from now until ``slot``'s next fetch in the trace (inf: not fetched again)."""
        if self._trace is None or self._recording is not None:
            return float("inf")
        uses = self._uses.get(id(slot), [])
        j = bisect.bisect_left(uses, self._cursor)
        return self._cum[uses[j]] - self._cum[self._cursor] if j < len(uses) else float("inf")

    def _prefetch(self) -> None:
        """Gather, without waiting, the upcoming events' parameters that fit the bucket and the live bound."""
        assert self._trace is not None
        budget, todo = self.prefetch_bucket_size, []
        live = self.params.live_numel
        self._ahead = max(self._ahead, self._cursor)
        for i in range(self._ahead, len(self._trace)):
            for s in self._trace[i]:
                if s.gathered or s in todo or s.persistent:
                    continue
                if s.numel > budget or live + s.numel > self.max_live:
                    self._ahead = i
                    self._launch(todo)
                    # with the partitions in files, the disk reads go on past the gathers (local work
                    # only, so ranks stay in step whatever their disks do)
                    return self._read_ahead(i)
                budget -= s.numel
                live += s.numel
                todo.append(s)
        self._ahead = len(self._trace)
        self._launch(todo)

    def _read_ahead(self, start: int) -> None:
        """With the partitions in files: start reading the pieces of the parameters of trace events
        ``start`` onwards into the free swap buffers (``_param_swap``), so the disk works while this module
        computes. Part of the prefetch: off with ``stage3_prefetch_bucket_size`` 0."""
        swap = self.params.swap
        if swap is None or self.prefetch_bucket_size <= 0 or self._trace is None:
            return
        for i in range(start, len(self._trace)):
            for s in self._trace[i]:
                if not (s.gathered or s.persistent) and not swap.read_ahead(id(s.param)):
                    return

    def _launch(self, todo: Sequence[ParamSlot]) -> None:
        if todo:
            self.prefetch_calls += 1
            self.params.gather(todo, wait=False)

    def _limit_live(self) -> None:
        """Release parameters kept for reuse, furthest next use first, while the live set is over the bound."""
        if self.params.live_numel <= self.max_live:
            return
        for s in sorted(self._kept.values(), key=self._reuse_distance, reverse=True):
            if self.params.live_numel <= self.max_live:
                break
            del self._kept[id(s)]
            self._released([s])

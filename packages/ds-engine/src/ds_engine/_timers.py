"""Wall-clock timers for ``wall_clock_breakdown``: forward, backward, reduction and step, per micro-step."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# DeepSpeed V14's timer names, so log parsers written for it keep working.
FORWARD, BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, STEP = "fwd", "bwd", "bwd_inner", "bwd_allreduce", "step"
NAMES = (FORWARD, BACKWARD, BACKWARD_INNER, BACKWARD_REDUCE, STEP)
MICRO = "_microstep"  # DeepSpeed's per-micro-step timers are these names with this suffix


class WallClockTimers:
    """Accumulates elapsed milliseconds per name until ``report()`` is called (which resets them).

    ``end_micro_step(boundary)`` (each engine ``step()``) takes DeepSpeed's ``get_wall_clock_timers()``
    snapshot: each name's milliseconds since the last accumulation boundary, and ``<name>_microstep``'s in
    this micro-step.

    Disabled timers cost one attribute check. On CUDA the device is synchronised at each boundary so
    the figures are the real durations, not the launch times.
    """

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self._sync = enabled and device.type == "cuda"
        self._elapsed_ms: dict[str, float] = defaultdict(float)
        self._window_ms: dict[str, float] = defaultdict(float)  # since the last accumulation boundary
        self._micro_ms: dict[str, float] = defaultdict(float)  # in this micro-step
        self.snapshot: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        if self._sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._sync:
                torch.cuda.synchronize()
            elapsed_ms = (time.perf_counter() - start) * 1e3
            self._elapsed_ms[name] += elapsed_ms
            self._window_ms[name] += elapsed_ms
            self._micro_ms[name] += elapsed_ms

    def end_micro_step(self, boundary: bool) -> None:
        """Take the snapshot, then start a new micro-step (and, at a boundary, a new window)."""
        if not self.enabled:
            return
        self.snapshot = {n + MICRO: self._micro_ms[n] for n in NAMES} | {n: self._window_ms[n] for n in NAMES}
        self._micro_ms.clear()
        if boundary:
            self._window_ms.clear()

    def report(self) -> str:
        """``"time (ms) | fwd: 12.34 | bwd: ..."`` for every timer that ran, then reset."""
        parts = [f"{name}: {ms:.2f}" for name, ms in self._elapsed_ms.items()]
        self._elapsed_ms.clear()
        return "time (ms) | " + " | ".join(parts)

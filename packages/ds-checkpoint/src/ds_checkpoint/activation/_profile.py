"""Timings of checkpointed regions when ``activation_checkpointing.profile`` is on."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

logger = logging.getLogger("ds_checkpoint.activation")


def synchronize_device() -> None:
    """Wait for queued CUDA work; a no-op on CPU, where every op is already synchronous."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@dataclass
class ActivationProfile:
    """Per-call wall times in milliseconds, in call order, since ``configure()`` or ``clear()``.

    ``forward_ms``: the no-grad forward of each ``checkpoint()`` call. ``recompute_ms``: the
    forward re-run in backward. ``backward_ms``: the backward through the recomputed graph.
    """

    forward_ms: list[float] = field(default_factory=list)
    recompute_ms: list[float] = field(default_factory=list)
    backward_ms: list[float] = field(default_factory=list)

    def clear(self) -> None:
        """Forget every recorded time."""
        self.forward_ms.clear()
        self.recompute_ms.clear()
        self.backward_ms.clear()

    def summary(self) -> str:
        """One line per phase: call count, total and mean milliseconds."""
        lines = []
        for phase in ("forward", "recompute", "backward"):
            times = getattr(self, f"{phase}_ms")
            mean = sum(times) / len(times) if times else 0.0
            lines.append(f"{phase}: {len(times)} calls, total {sum(times):.3f} ms, mean {mean:.3f} ms")
        return "\n".join(lines)


_NOT_TIMED = contextlib.nullcontext()  # reusable: the profile-off path allocates nothing per call


def timed(profile: ActivationProfile | None, phase: str) -> contextlib.AbstractContextManager[None]:
    """Time the body into ``profile.<phase>_ms`` and log it; does nothing when ``profile`` is None."""
    return _NOT_TIMED if profile is None else _timed(profile, phase)


@contextlib.contextmanager
def _timed(profile: ActivationProfile, phase: str) -> Iterator[None]:
    synchronize_device()  # CUDA kernels are asynchronous: time the work, not its launch
    start = time.perf_counter()
    yield
    synchronize_device()
    elapsed_ms = (time.perf_counter() - start) * 1e3
    getattr(profile, f"{phase}_ms").append(elapsed_ms)
    logger.info("activation checkpoint %s: %.3f ms", phase, elapsed_ms)

"""This rank's partition gradients, alive only from a backward's first reduction to the step.

In memory; with ``offload_optimizer.device: "nvme"`` they live in files instead (``_grad_swap.GradSwap``,
the same contract).

Nothing reads a partition gradient between the step and the next backward, so it does not exist then
(ZeRO-3's point is memory: a partition gradient of fp32 weights is as large as the weights). It is
allocated uninitialised when a backward first reduces into it, and each range is *written* the first
time it is reduced into (later reductions add): untouched pages of a large allocation are not resident,
so the partition becomes resident range by range as backward produces gradients, as activations are
freed, instead of being zero-filled at the start of backward (its peak). ``finish()`` zeroes what no
reduction wrote (padding) once a backward is over; ``clear()`` frees everything after the step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

__all__ = ["GradPartitions", "mark_written", "split_written"]


class GradPartitions:
    """One gradient partition per param group: ``numels[g]`` elements of ``dtypes[g]`` on ``devices[g]``."""

    def __init__(
        self, numels: Sequence[int], dtypes: Sequence[torch.dtype], devices: Sequence[torch.device]
    ) -> None:
        self.numels, self.dtypes, self.devices = list(numels), list(dtypes), list(devices)
        self._parts: list[torch.Tensor | None] = [None] * len(self.numels)
        self._written: list[list[tuple[int, int]]] = [[] for _ in self.numels]  # disjoint, sorted
        self.allocations = 0  # partitions allocated so far (observed by the tests)

    def __len__(self) -> int:
        return len(self._parts)

    def __iter__(self) -> Iterator[torch.Tensor]:
        """Every partition (the step reads them): zeros where no backward reduced into one."""
        parts = [self._part(g) for g in range(len(self._parts))]
        self.finish()
        return iter(parts)

    @property
    def allocated(self) -> list[bool]:
        """Per group, whether its partition gradient exists now."""
        return [p is not None for p in self._parts]

    def get(self, g: int, *, allocate: bool = False) -> torch.Tensor | None:
        """Group ``g``'s partition gradient as it stands (zeros where nothing was reduced); None when it
        does not exist now, unless ``allocate`` (zeros) is asked for."""
        if self._parts[g] is None and not allocate:
            return None
        part = self._part(g)
        self.finish()  # later reductions add to the zeros it writes, so this changes no sum
        return part

    def read(self, g: int, lo: int, hi: int) -> torch.Tensor | None:
        """Elements ``[lo, hi)`` of group ``g``'s partition gradient (a view), None when it does not exist now."""
        part = self.get(g)
        return None if part is None else part[lo:hi]

    def write(self, g: int, lo: int, hi: int, values: torch.Tensor) -> None:
        """Set elements ``[lo, hi)`` (the partition is allocated, zeros where nothing was reduced)."""
        self.get(g, allocate=True)[lo:hi].copy_(values)  # type: ignore[index]

    def add(self, g: int, lo: int, hi: int, grad: torch.Tensor, alpha: float) -> None:
        """``part[lo:hi] += alpha * grad`` (written, not added, where nothing was reduced yet)."""
        target = self._part(g)
        src = grad.to(target.device)
        for a, b, written in self._split(g, lo, hi):
            if written:
                target[a:b].add_(src[a - lo : b - lo], alpha=alpha)
            else:  # a copy then a scale in the partition's dtype: the sum 0 + alpha * grad exactly
                target[a:b].copy_(src[a - lo : b - lo])
                if alpha != 1.0:
                    target[a:b].mul_(alpha)
        self._mark(g, lo, hi)

    def finish(self) -> None:
        """Zero whatever part of an allocated partition no reduction wrote (padding, unused groups)."""
        for g, part in enumerate(self._parts):
            if part is not None:
                for a, b, written in self._split(g, 0, self.numels[g]):
                    if not written:
                        part[a:b].zero_()
                self._written[g] = [(0, self.numels[g])]

    def clear(self) -> None:
        """Free every partition gradient (after a step: nothing reads them until the next backward)."""
        self._parts = [None] * len(self._parts)
        self._written = [[] for _ in self._parts]

    def _part(self, g: int) -> torch.Tensor:
        if self._parts[g] is None:
            self._parts[g] = torch.empty(self.numels[g], dtype=self.dtypes[g], device=self.devices[g])
            self.allocations += 1
        return self._parts[g]

    def _split(self, g: int, lo: int, hi: int) -> list[tuple[int, int, bool]]:
        return split_written(self._written[g], lo, hi)

    def _mark(self, g: int, lo: int, hi: int) -> None:
        self._written[g] = mark_written(self._written[g], lo, hi)


def split_written(written: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int, bool]]:
    """``[lo, hi)`` cut into runs, each with whether it lies in ``written`` (disjoint, sorted ranges)."""
    out, pos = [], lo
    for a, b in written:
        if b <= pos or a >= hi:
            continue
        if a > pos:
            out.append((pos, a, False))
        out.append((max(a, pos), min(b, hi), True))
        pos = min(b, hi)
    if pos < hi:
        out.append((pos, hi, False))
    return out


def mark_written(written: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``written`` with ``[lo, hi)`` added, merged back into disjoint, sorted ranges."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted([*written, (lo, hi)]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged

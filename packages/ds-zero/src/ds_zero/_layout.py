"""Flat partition layout of one parameter group (docs/design.md §6, "Partition layout")."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupLayout:
    """Where each parameter of a group lives in the group's flat buffer, and who owns which slice.

    The flat space is the group's trainable parameters concatenated in group order, zero-padded at
    the end so ``padded_numel % (2 * dp) == 0``, then cut into ``dp`` equal contiguous partitions.
    All padding falls in the last partition. A parameter may straddle two partitions.
    """

    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    numel: int
    padded_numel: int
    dp: int

    @classmethod
    def build(cls, shapes: list[torch.Size], dp: int) -> GroupLayout:
        """Lay out parameters of the given shapes for ``dp`` ranks."""
        offsets, total = [], 0
        for s in shapes:
            offsets.append(total)
            total += int(torch.Size(s).numel())
        align = 2 * dp
        padded = max(align, -(-total // align) * align)
        return cls(tuple(torch.Size(s) for s in shapes), tuple(offsets), total, padded, dp)

    @property
    def partition_numel(self) -> int:
        """Elements per partition (padding included)."""
        return self.padded_numel // self.dp

    def partition_range(self, rank: int) -> tuple[int, int]:
        """``[start, end)`` of ``rank``'s partition in the padded flat space."""
        start = rank * self.partition_numel
        return start, start + self.partition_numel

    def shard(self, rank: int) -> tuple[int, int]:
        """``rank``'s slice of the unpadded space ``[0, numel)``, as written to disk."""
        start, end = self.partition_range(rank)
        return min(start, self.numel), min(end, self.numel)

    def param_range(self, index: int) -> tuple[int, int]:
        """``[start, end)`` of parameter ``index`` in the flat space."""
        start = self.offsets[index]
        return start, start + int(self.shapes[index].numel())

    def owners(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``(rank, lo, hi)`` for every partition overlapping the flat range ``[start, end)``."""
        out = []
        part = self.partition_numel
        for r in range(start // part, min(self.dp, -(-end // part))):
            lo, hi = max(start, r * part), min(end, (r + 1) * part)
            if lo < hi:
                out.append((r, lo, hi))
        return out

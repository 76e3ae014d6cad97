"""DeepSpeed's process topologies: named axes over ranks, row-major (the last axis varies fastest).

Pure arithmetic, no process groups: ds-engine builds the groups (one DeviceMesh for every axis) and hands
them to the pipeline; these classes say which rank sits where, as DeepSpeed's do, so a script that shards
its data by ``engine.grid`` sees the same ranks under ds as under DeepSpeed.
"""

from __future__ import annotations

import itertools
from collections import namedtuple
from typing import Any

__all__ = ["PipeDataParallelTopology", "PipeModelDataParallelTopology", "ProcessTopology"]


class ProcessTopology:
    """Maps coordinates along named axes (``axes``, of lengths ``dims``) to global ranks, row-major."""

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        if len(axes) != len(dims):
            raise ValueError(f"ProcessTopology: {len(axes)} axes {axes} but {len(dims)} dims {dims}")
        self.axes = list(axes)
        self.dims = list(dims)
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)  # type: ignore[misc]
        coords = itertools.product(*(range(d) for d in self.dims))
        self.mapping = {self.ProcessCoord(*c): rank for rank, c in enumerate(coords)}
        self._by_rank = {rank: c for c, rank in self.mapping.items()}

    def get_rank(self, **coord: int) -> int:
        if len(coord) != len(self.axes):
            raise ValueError("get_rank() does not support slices. Use filter_match())")
        key = self.ProcessCoord(**coord)
        if key not in self.mapping:
            raise ValueError(f"key {coord} invalid for a topology of axes {self.axes} dims {self.dims}")
        return self.mapping[key]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_rank_repr(
        self, rank: int, omit_axes: Any = ("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-"
    ) -> str:
        """``rank``'s coordinates along the axes not omitted, as ``model_01`` (checkpoint file names)."""
        omit = frozenset(omit_axes)
        coord = self.get_coord(rank)
        return outer_sep.join(
            f"{ax}{inner_sep}{getattr(coord, ax):02d}" for ax in self.axes if ax not in omit
        )

    def get_dim(self, axis: str) -> int:
        """The length of ``axis`` (0 when the topology has no such axis, as DeepSpeed)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank: int) -> Any:
        if rank not in self._by_rank:
            raise ValueError(f"rank {rank} not found in topology.")
        return self._by_rank[rank]

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """The rank lists of the groups along ``axis``: ranks equal in every other axis, in order."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for values in itertools.product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, values))
            lists.append(
                [self.mapping[self.ProcessCoord(**fixed, **{axis: i})] for i in range(self.get_dim(axis))]
            )
        return lists

    def filter_match(self, **criteria: int) -> list[int]:
        """The ranks whose coordinates equal ``criteria`` on the axes named there."""
        return [
            rank
            for coord, rank in self.mapping.items()
            if all(getattr(coord, k) == v for k, v in criteria.items())
        ]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """The ranks whose coordinate along ``axis`` is ``idx``."""
        i = self.axes.index(axis)
        return [rank for coord, rank in self.mapping.items() if coord[i] == idx]

    def world_size(self) -> int:
        return len(self.mapping)

    def __str__(self) -> str:
        return str(self.mapping)


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline x data parallelism; data-parallel peers are consecutive ranks."""

    def __init__(self, num_pp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline x data x tensor (``model``) parallelism; tensor-parallel peers are consecutive ranks."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])

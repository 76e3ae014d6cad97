"""Column- and row-parallel linear layers holding this rank's shard as ordinary parameters.

The shards are plain tensors (not DTensors) so that ZeRO can make them views of its flat buffers; each
sharded parameter is marked ``tensor_model_parallel`` (ZeRO's norm counts it on every tensor-parallel rank,
whole parameters on the first only) and carries :class:`ShardInfo`, which :mod:`._state` uses to put the
whole weight back together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup

from ._comm import copy_to_tp, gather_from_tp, linear_overlapped, reduce_from_tp

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "ShardInfo", "join_shards", "shard_info", "split_dim"]

_INFO = "ds_tp_shard"


@dataclass(frozen=True)
class ShardInfo:
    """How a parameter was split: along ``dim``, each of the sub-weights ``sizes`` (their sum is the whole
    dimension; one entry for an ordinary weight) cut into ``world`` equal pieces."""

    dim: int
    sizes: tuple[int, ...]
    world: int


def shard_info(param: torch.Tensor) -> ShardInfo | None:
    return getattr(param, _INFO, None)


def split_dim(full: torch.Tensor, info: ShardInfo, rank: int) -> torch.Tensor:
    """This rank's shard of the whole tensor ``full``."""
    subs = full.split(list(info.sizes), dim=info.dim)
    return torch.cat([s.chunk(info.world, dim=info.dim)[rank] for s in subs], dim=info.dim).contiguous()


def join_shards(shards: list[torch.Tensor], info: ShardInfo) -> torch.Tensor:
    """The whole tensor from every rank's shard (in group-rank order)."""
    pieces = [s.split([n // info.world for n in info.sizes], dim=info.dim) for s in shards]
    return torch.cat([pieces[r][i] for i in range(len(info.sizes)) for r in range(info.world)], dim=info.dim)


def _shard_param(param: torch.Tensor, info: ShardInfo, rank: int) -> nn.Parameter:
    shard = nn.Parameter(split_dim(param.detach(), info, rank).clone(), requires_grad=param.requires_grad)
    shard.tensor_model_parallel = True  # type: ignore[attr-defined]
    setattr(shard, _INFO, info)
    return shard


class ColumnParallelLinear(nn.Module):
    """``nn.Linear`` with its output features split over ``group`` (its weight's dim 0, bias with it)."""

    def __init__(
        self,
        linear: nn.Linear,
        group: ProcessGroup,
        *,
        sub_sizes: tuple[int, ...] | None = None,
        gather_output: bool = False,
        overlap_comm: bool = False,
    ) -> None:
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        info = ShardInfo(0, tuple(sub_sizes or (linear.out_features,)), world)
        self.group, self.gather_output, self.overlap_comm = group, gather_output, overlap_comm
        self.in_features, self.out_features = linear.in_features, linear.out_features // world
        self.weight = _shard_param(linear.weight, info, rank)
        self.bias = (
            _shard_param(linear.bias, ShardInfo(0, info.sizes, world), rank)
            if linear.bias is not None
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.overlap_comm and torch.is_grad_enabled():
            out = linear_overlapped(x, self.weight, self.bias, self.group)
        else:
            out = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(out, self.group) if self.gather_output else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features} (this rank's), gather_output={self.gather_output}"


class RowParallelLinear(nn.Module):
    """``nn.Linear`` with its input features split over ``group`` (its weight's dim 1); the partial outputs are
    summed over the group and the (whole) bias added after the sum."""

    def __init__(
        self, linear: nn.Linear, group: ProcessGroup, *, sub_sizes: tuple[int, ...] | None = None
    ) -> None:
        super().__init__()
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        info = ShardInfo(1, tuple(sub_sizes or (linear.in_features,)), world)
        self.group = group
        self.in_features, self.out_features = linear.in_features // world, linear.out_features
        self.weight = _shard_param(linear.weight, info, rank)
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = reduce_from_tp(F.linear(x, self.weight), self.group)
        return out + self.bias if self.bias is not None else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features} (this rank's), out_features={self.out_features}"

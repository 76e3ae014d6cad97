"""Expert parameters across the expert-data-parallel group: start equal, and average their gradients.

An expert's gradient already holds every expert-parallel rank's tokens (the all-to-all carried them), so it
is summed over the ranks holding the same expert (the expert-data-parallel group) and divided by the whole
data-parallel world size, as DeepSpeed does: the result does not depend on ``ep_size``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["broadcast_experts", "reduce_expert_gradients"]


def reduce_expert_gradients(
    params: Iterable[nn.Parameter], expert_dp_group: dist.ProcessGroup | None, dp_world_size: int
) -> int:
    """Sum each gradient over ``expert_dp_group`` (one flat all-reduce per dtype), divide by
    ``dp_world_size``; returns the all-reduces issued."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    calls = 0
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        if expert_dp_group is not None and dist.get_world_size(expert_dp_group) > 1:
            dist.all_reduce(flat, group=expert_dp_group)
            calls += 1
        flat.div_(dp_world_size)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    return calls


def broadcast_experts(params: Iterable[nn.Parameter], expert_dp_group: dist.ProcessGroup | None) -> None:
    """Every rank of ``expert_dp_group`` starts from its first rank's expert weights."""
    if expert_dp_group is None or dist.get_world_size(expert_dp_group) == 1:
        return
    src = dist.get_global_rank(expert_dp_group, 0)
    with torch.no_grad():
        for p in params:
            dist.broadcast(p.data, src=src, group=expert_dp_group)

"""Dispatch and combine: tokens into per-expert buffers ``[E, capacity, M]``, across the expert-parallel
group with ``all_to_all_single`` (each rank sends expert ``e``'s rows to the rank holding ``e``), and back.

With ``ep`` ranks holding ``E / ep`` experts each, the buffer's experts are in rank order, so splitting its
first dimension in ``ep`` equal parts is exactly what each rank must receive; the all-to-all's backward is
the same all-to-all of the gradient. Bytes each way per layer and step: ``E * capacity * M * element size``
(of which ``1/ep`` stays on the rank).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllToAll", "all_to_all", "combine", "dispatch", "stats"]

stats = {"all_to_all_calls": 0, "all_to_all_bytes": 0}  # observed by the tests and the benchmark


class AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, group: dist.ProcessGroup, x: torch.Tensor) -> torch.Tensor:
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        return None, _exchange(grad, ctx.group)


def _exchange(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    stats["all_to_all_calls"] += 1
    stats["all_to_all_bytes"] += x.numel() * x.element_size()
    return out


def all_to_all(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``x``'s first dimension split over ``group``'s ranks and exchanged (identity without a group)."""
    if group is None or dist.get_world_size(group) == 1:
        return x.contiguous()
    return AllToAll.apply(group, x)


def _flat_slots(experts: torch.Tensor, slots: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Each route's row in the flat ``[E * capacity]`` buffer; dropped routes point at one spare row."""
    return torch.where(experts >= 0, experts * capacity + slots, num_experts * capacity)


def dispatch(x: torch.Tensor, experts: torch.Tensor, slots: torch.Tensor, num_experts: int, capacity: int):
    """``(buffer [E, capacity, M], rows)``: token rows copied to their routes' slots (empty slots are 0)."""
    tokens, width = x.shape
    rows = _flat_slots(experts, slots, num_experts, capacity)
    source = torch.full((num_experts * capacity + 1,), tokens, dtype=torch.long, device=x.device)
    source.scatter_(0, rows.reshape(-1), torch.arange(tokens, device=x.device).expand_as(rows).reshape(-1))
    padded = torch.cat([x, x.new_zeros(1, width)])
    return padded.index_select(0, source[:-1]).view(num_experts, capacity, width), rows


def combine(out: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Each token's routes' expert outputs, weighted and summed: ``[S, M]``."""
    width = out.shape[-1]
    flat = torch.cat([out.reshape(-1, width), out.new_zeros(1, width)])
    picked = flat.index_select(0, rows.reshape(-1)).view(rows.shape[0], rows.shape[1], width)
    return (picked * weights.unsqueeze(-1)).sum(dim=0).to(out.dtype)

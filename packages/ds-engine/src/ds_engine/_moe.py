"""Mixture-of-experts layers (ds_moe) in the engine: their groups, their weights' start, their gradients.

Each ``ds_moe.MoE`` layer gets the topology's ``expert_groups(ep_size)`` (the ranks it exchanges tokens
with, and those holding the same experts). Expert parameters differ between expert-parallel ranks, so they
are broadcast within the expert-data-parallel group only, left out of the data-parallel reducer, and
their gradients are summed over the expert-data-parallel group and divided by the data-parallel world size
(DeepSpeed's rule). With ``ep_size`` 1 the expert-data group is the data-parallel one and nothing differs
from a dense model, so every ZeRO stage works; with ``ep_size`` > 1, ZeRO stages 1-3 would partition the
experts over ranks that do not hold them: ds refuses that, naming the way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ds_moe
from torch import nn

from ds_engine._missing import FeatureNotAvailableError
from ds_engine.topology import get_topology

__all__ = ["MoeParts", "setup_moe"]


@dataclass
class MoeParts:
    """The model's MoE layers and, per expert-data-parallel group of an ``ep_size`` > 1, the expert parameters
    reduced over it (at ``ep_size`` 1 the experts are ordinary data-parallel parameters)."""

    layers: list[Any]
    groups: list[tuple[list[nn.Parameter], Any]] = field(default_factory=list)
    dp_world_size: int = 1

    @property
    def expert_params(self) -> list[nn.Parameter]:
        return [p for params, _ in self.groups for p in params]

    def broadcast(self) -> None:
        for params, group in self.groups:
            ds_moe.broadcast_experts(params, group)

    def reduce(self) -> None:
        for params, group in self.groups:
            ds_moe.reduce_expert_gradients(params, group, self.dp_world_size)


def setup_moe(model: nn.Module, stage: int, dp_world_size: int) -> MoeParts | None:
    """Give every MoE layer its groups; None for a model without one."""
    layers = [m for m in model.modules() if isinstance(m, ds_moe.MoE)]
    if not layers:
        return None
    topo = get_topology()
    parts = MoeParts(layers, dp_world_size=dp_world_size)
    by_group: dict[int, tuple[list[nn.Parameter], Any]] = {}
    for m in layers:
        ep_group, edp_group = topo.expert_groups(m.ep_size)
        m.set_process_groups(ep_group if m.ep_size > 1 else None, edp_group)
        if m.ep_size > 1:
            params, _ = by_group.setdefault(m.ep_size, ([], edp_group))
            params.extend(p for p in m.parameters() if ds_moe.is_moe_param(p))
    parts.groups = list(by_group.values())
    if parts.groups and stage > 0:
        raise FeatureNotAvailableError(
            f"ZeRO stage {stage} with expert parallelism (an MoE layer with ep_size > 1) is not available in ds "
            "(DeepSpeed has it, ds does not): ZeRO would partition experts over ranks that do not hold them. "
            "Use zero_optimization.stage 0, or ep_size 1 (every rank holds every expert; any stage)."
        )
    return parts

"""Mixture-of-experts layers (ds_moe) in the engine: their groups, their weights' start, their gradients.

Each ``ds_moe.MoE`` layer gets the topology's ``expert_groups(ep_size)`` (the ranks it exchanges tokens
with, and those holding the same experts). Expert parameters differ between expert-parallel ranks, so they
are broadcast within the expert-data-parallel group only, left out of the data-parallel reducer, and
their gradients are summed over the expert-data-parallel group and divided by the data-parallel world size
(DeepSpeed's rule). With ``ep_size`` 1 the expert-data group is the data-parallel one and nothing differs
from a dense model, so every ZeRO stage works. With ``ep_size`` > 1, ZeRO stages 1 and 2 partition each
expert param group over its expert-data-parallel group (``partition_groups``: the optimizer needs the
experts in groups of their own, as DeepSpeed does); stage 3 is refused, as DeepSpeed 0.19.8 refuses its
MoE layer at stage 3 altogether.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import ds_moe
import ds_zero
import torch
from torch import nn

from ds_engine.topology import get_topology

__all__ = ["MoeParts", "setup_moe"]


@dataclass
class MoeParts:
    """The model's MoE layers and, per expert-data-parallel group of an ``ep_size`` > 1, the expert parameters
    reduced over it (at ``ep_size`` 1 the experts are ordinary data-parallel parameters)."""

    layers: list[Any]
    groups: list[tuple[list[nn.Parameter], Any]] = field(default_factory=list)
    dp_world_size: int = 1
    ep_sizes: list[int] = field(default_factory=list)  # the ``ep_size`` of each of ``groups``

    @property
    def expert_params(self) -> list[nn.Parameter]:
        return [p for params, _ in self.groups for p in params]

    def broadcast(self) -> None:
        for params, group in self.groups:
            ds_moe.broadcast_experts(params, group)

    def reduce(self) -> None:
        for params, group in self.groups:
            ds_moe.reduce_expert_gradients(params, group, self.dp_world_size)

    def partition_groups(self, optimizer: torch.optim.Optimizer, stage: int) -> dict[int, Any]:
        """ZeRO 1/2: each param group of expert parameters -> the expert-data-parallel group it is partitioned
        and reduced over. A group mixing experts with other parameters (or experts of two ``ep_size``) is
        refused with DeepSpeed's remedy; DeepSpeed asserts there too."""
        owner = {
            id(p): (ep, group) for (params, group), ep in zip(self.groups, self.ep_sizes) for p in params
        }
        chosen: dict[int, Any] = {}
        for i, g in enumerate(optimizer.param_groups):
            trained = [p for p in g["params"] if p.requires_grad]
            experts = [owner[id(p)] for p in trained if id(p) in owner]
            if not experts:
                continue
            eps = sorted({ep for ep, _ in experts})
            if len(experts) != len(trained) or len(eps) > 1:
                others = len(trained) - len(experts)
                raise ds_zero.ZeroAssertionError(
                    f"ZeRO stage {stage} with expert parallelism: optimizer param group {i} holds expert "
                    f"parameters (ep_size {', '.join(map(str, eps))}) together with "
                    f"{others} other parameter(s)"
                    + (" and experts of another ep_size" if len(eps) > 1 else "")
                    + ". ZeRO partitions expert parameters over the ranks holding the same experts, so they "
                    "need param groups of their own, as in DeepSpeed: build the optimizer from "
                    "deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer(param_groups) "
                    "(a config optimizer gets such groups by itself)"
                )
            chosen[i] = experts[0][1]
        return chosen


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
    parts.ep_sizes = list(by_group)
    if parts.groups and stage == 3:
        raise ds_zero.ZeroAssertionError(
            f"ZeRO stage 3 with expert parallelism (an MoE layer with ep_size {max(by_group)}) is not available: "
            'DeepSpeed 0.19.8 refuses its MoE layer at stage 3 altogether ("Native DeepSpeed MoE is not '
            'supported with ZeRO Stage 3. Use AutoEP or choose ZeRO stage 1/2."); ds trains it at stage 3 '
            "with ep_size 1 only. Use zero_optimization.stage 1 or 2 with ep_size > 1, or ep_size 1."
        )
    return parts

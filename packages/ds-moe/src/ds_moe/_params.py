"""Which parameters are experts', and the optimizer groups DeepSpeed-MoE scripts build from them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = [
    "configure_moe_param_groups",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "split_params_grads_into_shared_and_expert_params",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
]


def is_moe_param(param: torch.Tensor) -> bool:
    """An expert's parameter (marked ``allreduce = False`` by ``Experts``)."""
    return hasattr(param, "allreduce") and not param.allreduce


def has_moe_layers(m: nn.Module) -> tuple[bool, int]:
    """``(True, num_experts of the first MoE layer)`` when ``m`` holds an MoE layer, else ``(False, 0)``."""
    from ._layer import MoE

    for module in m.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0


def split_params_into_shared_and_expert_params(
    params: Iterable[nn.Parameter],
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    shared, expert = [], []
    for p in params:
        (expert if is_moe_param(p) else shared).append(p)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(
    group: Iterable[nn.Parameter],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gradients (in each parameter's dtype) of the shared and of the expert parameters that have one."""
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def is_moe_param_group(param_group: dict) -> bool:
    return bool(param_group.get("moe", False))


def split_params_into_different_moe_groups_for_optimizer(
    param_groups: dict | list | tuple, max_group_size: int | float | None = 178956971
) -> list[dict[str, Any]]:
    """Each group's expert parameters moved into groups of their own (``moe: True``, ``name``: the expert
    group's name, the other options copied), split into groups of at most ``max_group_size`` elements;
    the given groups keep their other parameters. Every group needs a ``name`` (DeepSpeed's rule)."""
    if isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif not isinstance(param_groups, list):
        raise ValueError(f"param_groups must be a dict or a list of dicts, not {type(param_groups).__name__}")
    names = list(dict.fromkeys(p.group_name for g in param_groups for p in g["params"] if is_moe_param(p)))
    moe: dict[str, dict[str, dict]] = {}
    for g in param_groups:
        if "name" not in g and names:
            raise ValueError("every parameter group needs a 'name' to split its expert parameters off")
        moe[g.get("name")] = {n: {**g, "name": n, "moe": True, "params": []} for n in names}
    for g in param_groups:
        kept = []
        for p in g["params"]:
            if is_moe_param(p):
                moe[g.get("name")][p.group_name]["params"].append(p)
            else:
                kept.append(p)
        g["params"] = kept
    for by_name in moe.values():
        for g in by_name.values():
            if max_group_size is None:
                param_groups.append(g)
                continue
            chunks: list[list] = []
            size = 0
            for p in g["params"]:
                n = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                if chunks and size + n <= max_group_size:
                    chunks[-1].append(p)
                    size += n
                else:
                    chunks.append([p])
                    size = n
            for c in chunks or [[]]:
                param_groups.append({**g, "params": c})
    return param_groups


def configure_moe_param_groups(model_parameters: list) -> list:
    """The groups DeepSpeed's engine gives a config optimizer of a model with MoE layers: a list of
    parameters becomes one group named ``dense-params`` with its experts split off; a list of groups none of
    which is marked ``moe`` is split; groups already marked are kept as they are."""
    if not isinstance(model_parameters, list):
        raise TypeError(f"model_parameters must be a list, not {type(model_parameters).__name__}")
    for p in model_parameters:
        if not isinstance(p, torch.Tensor | dict):
            raise TypeError(
                "param argument that would be given to the optimizer should be an iterable of Tensors or "
                f"dicts, but got {type(p)}"
            )
    if not model_parameters:
        return model_parameters
    if isinstance(model_parameters[0], torch.Tensor):
        return split_params_into_different_moe_groups_for_optimizer(
            {"params": model_parameters, "name": "dense-params"}
        )
    if any("moe" in g for g in model_parameters):
        return model_parameters
    return split_params_into_different_moe_groups_for_optimizer(model_parameters)

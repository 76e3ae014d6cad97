"""Mixture of experts with expert parallelism (DeepSpeed-MoE's layer and rules).

``MoE`` routes each token to its top-1 or top-2 experts with a capacity per expert, exchanges the tokens
with ``all_to_all_single`` over the expert-parallel group it is given (``set_process_groups``), and returns
``(output, l_aux, exp_counts)``. ``_gate`` holds the routing, ``_dispatch`` the exchange, ``_params`` the
expert-parameter helpers, ``_grads`` the reduction of expert gradients over the expert-data-parallel group.
"""

from ._dispatch import AllToAll, all_to_all, stats
from ._gate import Routes, top1_routes, top2_routes
from ._grads import broadcast_experts, reduce_expert_gradients
from ._layer import Experts, MoE, MOELayer, TopKGate
from ._params import (
    configure_moe_param_groups,
    has_moe_layers,
    is_moe_param,
    is_moe_param_group,
    split_params_grads_into_shared_and_expert_params,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)

__all__ = [
    "AllToAll",
    "Experts",
    "MOELayer",
    "MoE",
    "Routes",
    "TopKGate",
    "all_to_all",
    "broadcast_experts",
    "configure_moe_param_groups",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "reduce_expert_gradients",
    "split_params_grads_into_shared_and_expert_params",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
    "stats",
    "top1_routes",
    "top2_routes",
]

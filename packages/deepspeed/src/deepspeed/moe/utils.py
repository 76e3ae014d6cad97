"""DeepSpeed's ``deepspeed.moe.utils``: the expert-parameter helpers of ds_moe."""

from ds_moe import (
    configure_moe_param_groups,
    has_moe_layers,
    is_moe_param,
    is_moe_param_group,
    split_params_grads_into_shared_and_expert_params,
    split_params_into_different_moe_groups_for_optimizer,
    split_params_into_shared_and_expert_params,
)

__all__ = [
    "configure_moe_param_groups",
    "has_moe_layers",
    "is_moe_param",
    "is_moe_param_group",
    "split_params_grads_into_shared_and_expert_params",
    "split_params_into_different_moe_groups_for_optimizer",
    "split_params_into_shared_and_expert_params",
]

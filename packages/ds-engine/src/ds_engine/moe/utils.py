"""``deepspeed.moe.utils``: its helpers need expert parallelism, which ds lacks; each fails at use."""

from ds_engine._missing import missing_function

_FEATURE = "mixture-of-experts parameter groups (deepspeed.moe)"
_INSTEAD = "Without MoE layers, pass model.parameters() (or your own groups) to the optimizer."

split_params_into_different_moe_groups_for_optimizer = missing_function(
    __name__, "split_params_into_different_moe_groups_for_optimizer", _FEATURE, _INSTEAD
)
is_moe_param = missing_function(__name__, "is_moe_param", _FEATURE, _INSTEAD)

__all__ = ["is_moe_param", "split_params_into_different_moe_groups_for_optimizer"]

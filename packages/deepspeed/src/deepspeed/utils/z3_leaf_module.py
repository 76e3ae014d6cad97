"""DeepSpeed's ``deepspeed.utils.z3_leaf_module``: ZeRO-3 leaf modules are not in ds; each name fails at use.

DeepSpeed gathers a leaf module's parameters all at once (for MoE layers whose experts run
conditionally). ds's stage 3 gathers per module as each runs; it has no leaf marking. Accelerate calls
``set_z3_leaf_modules`` only when its plugin names MoE layer classes.
"""

from ds_engine._missing import missing_function

_FEATURE = "ZeRO-3 leaf modules (deepspeed.utils.set_z3_leaf_modules and friends)"
_INSTEAD = "Leave the MoE layer classes unset (Accelerate: transformer_moe_cls_names / deepspeed_moe_layer_cls_names)."

set_z3_leaf_modules = missing_function(__name__, "set_z3_leaf_modules", _FEATURE, _INSTEAD)
unset_z3_leaf_modules = missing_function(__name__, "unset_z3_leaf_modules", _FEATURE, _INSTEAD)
get_z3_leaf_modules = missing_function(__name__, "get_z3_leaf_modules", _FEATURE, _INSTEAD)
z3_leaf_module = missing_function(__name__, "z3_leaf_module", _FEATURE, _INSTEAD)

__all__ = ["get_z3_leaf_modules", "set_z3_leaf_modules", "unset_z3_leaf_modules", "z3_leaf_module"]

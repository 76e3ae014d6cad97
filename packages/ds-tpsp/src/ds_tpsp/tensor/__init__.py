"""AutoTP training: a model's linear layers split over a tensor-parallel group given as an argument.

``shard_model(model, group, cfg.tensor_parallel)`` replaces the layers in place (attention q/k/v and MLP
up/gate column-wise, o and down row-wise, the LM head column-wise with its logits gathered, as the
model's Hugging Face plan or DeepSpeed's rules say); ``full_state_dict`` gives back the whole weights.
"""

from ._comm import copy_to_tp, gather_from_tp, reduce_from_tp, split_to_tp
from ._layers import ColumnParallelLinear, RowParallelLinear, ShardInfo, join_shards, shard_info, split_dim
from ._plan import PRESETS, Spec, resolve_specs
from ._shard import ShardPlan, TensorParallelError, shard_model, tp_group_of
from ._state import full_state_dict, gather_full, load_full_state_dict, shard_full

__all__ = [
    "PRESETS",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "ShardInfo",
    "ShardPlan",
    "Spec",
    "TensorParallelError",
    "copy_to_tp",
    "full_state_dict",
    "gather_from_tp",
    "gather_full",
    "join_shards",
    "load_full_state_dict",
    "reduce_from_tp",
    "resolve_specs",
    "shard_full",
    "shard_info",
    "shard_model",
    "split_dim",
    "split_to_tp",
    "tp_group_of",
]

"""DeepSpeed's ``deepspeed.runtime.constants``: the config's key names and defaults, from ds_config's models.

DeepSpeed spells each key as ``NAME = "name"`` and its default as ``NAME_DEFAULT``. Here both come from
ds_config's models (the one definition of the config), so a ``*_DEFAULT`` is what ds really uses; where
DeepSpeed's constant disagrees with DeepSpeed's own config default, ds follows the config (the test
against DeepSpeed 0.19.8's record lists those names). Keys of a section are prefixed with the section
(``FP16_LOSS_SCALE = "loss_scale"``), as DeepSpeed does.
"""

from __future__ import annotations

from typing import Any

from ds_config import BF16Config, CheckpointConfig, DSConfig, FP16Config
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROUTE_TRAIN, ROUTE_EVAL, ROUTE_PREDICT, ROUTE_ENCODE = "train", "eval", "predict", "encode"
OPTIMIZER_PARAMS = SCHEDULER_PARAMS = "params"
TYPE = "type"
MAX_GRAD_NORM = "max_grad_norm"
BFLOAT16_OLD = "bfloat16"
CHECK_OVERFLOW = "check_overflow"
CHECKPOINT_TAG_VALIDATION = "tag_validation"
CHECKPOINT_TAG_VALIDATION_MODES = ["WARN", "IGNORE", "FAIL"]
GRADIENT_ALLREDUCE_OP_MEAN, GRADIENT_ALLREDUCE_OP_SUM = "mean", "sum"
DATA_PARALLEL_GROUP = "data_parallel_group"
GLOBAL_RANK = "global_rank"
PIPE_REPLICATED = "ds_pipe_replicated"


def _default(model: type[BaseModel], name: str) -> Any:
    field = model.model_fields[name]
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return None
    return value.value if hasattr(value, "value") and not isinstance(value, (int, float, str)) else value


def _define(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    """``PREFIX_KEY = "key"`` and ``PREFIX_KEY_DEFAULT`` for each scalar field of ``model``."""
    names: dict[str, Any] = {}
    for key, field in model.model_fields.items():
        const = f"{prefix}{key.upper()}"
        names[const] = field.alias or key
        default = _default(model, key)
        if default is None or isinstance(default, (bool, int, float, str)):
            names[f"{const}_DEFAULT"] = default
    return names


_GENERATED = {
    **_define(DSConfig, ""),
    **_define(FP16Config, "FP16_"),
    **_define(BF16Config, "BFLOAT16_"),
    **{k: v for k, v in _define(CheckpointConfig, "CHECKPOINT_").items() if not k.endswith("_DEFAULT")},
}
_GENERATED.update(FP16="fp16", BFLOAT16="bf16", CHECKPOINT="checkpoint")
globals().update({k: v for k, v in _GENERATED.items() if k not in globals()})

__all__ = sorted(n for n in globals() if n.isupper())  # noqa: PLE0605

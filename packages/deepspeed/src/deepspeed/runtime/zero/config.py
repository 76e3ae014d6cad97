"""DeepSpeed's ``deepspeed.runtime.zero.config``: the ZeRO section's models and enums, over ds_config.

``DeepSpeedZeroConfig`` is ds_config's ``ZeroConfig`` read with DeepSpeed's field names too
(``prefetch_bucket_size`` for the ``stage3_prefetch_bucket_size`` key, ``gather_16bit_weights_on_model_save``,
``pipeline_loading_checkpoint``; see ``deepspeed.runtime._views``); the offload sections likewise.
``ZeroStageEnum`` and ``OffloadDeviceEnum`` carry DeepSpeed's member names and values, so
``config.stage == ZeroStageEnum.gradients`` holds for ds's int stage.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from ds_config import load_config

from deepspeed.runtime._config_source import deepspeed_defaults
from deepspeed.runtime._views import (
    DeepSpeedZeroConfig,
    DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig,
    view,
)
from deepspeed.runtime.config_utils import DeepSpeedConfigModel, get_scalar_param, pp_int
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

__all__ = [
    "ZERO_FORMAT",
    "ZERO_OPTIMIZATION",
    "DeepSpeedConfigModel",
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadDeviceEnum",
    "ZeroStageEnum",
    "get_scalar_param",
    "get_zero_config",
    "pp_int",
    "read_zero_config_deprecated",
]

ZERO_OPTIMIZATION = "zero_optimization"
ZERO_FORMAT = """
ZeRO optimization should be enabled as:
"session_params": {
  "zero_optimization": {
    "stage": [0|1|2],
    "stage3_max_live_parameters" : 1000000000,
    "stage3_max_reuse_distance" : 1000000000,
    "stage3_use_all_reduce_for_fetch_params": [true|false],
    "stage3_module_granularity_threshold": 0,
    "allgather_partitions": [true|false],
    "use_multi_rank_bucket_allreduce": [true|false],
    "stage3_allgather_sequential": [true|false],
    "allgather_bucket_size": 500000000,
    "reduce_scatter": [true|false],
    "contiguous_gradients" : [true|false]
    "overlap_comm": [true|false],
    "reduce_bucket_size": 500000000,
    "load_from_fp32_weights": [true|false],
    "cpu_offload": [true|false] (deprecated),
    "cpu_offload_param" : [true|false] (deprecated),
    "cpu_offload_use_pin_memory": [true|false] (deprecated),
    "sub_group_size" : 1000000000000,
    "offload_param": {...},
    "offload_optimizer": {...},
    "ignore_unused_parameters": [true|false],
    "round_robin_gradients": [true|false],
    "zero_hpz_partition_size": 1,
    "zero_quantized_weights": [true|false],
    "zero_quantized_nontrainable_weights": [true|false],
    "zero_quantized_gradients": [true|false],
    "memory_efficient_linear": [true|false],
    "override_module_apply": [true|false],
    "zeropp_loco_param": {...},
    "log_trace_cache_warnings" : [true|false],
    "enable_sanity_checks": [true|false],
  }
}
"""


class ZeroStageEnum(IntEnum):
    """What each ZeRO stage partitions (DeepSpeed's names)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def read_zero_config_deprecated(param_dict: dict[str, Any]) -> dict[str, Any]:
    """The section of the deprecated ``"zero_optimization": true|false`` form (stage 1 with the top-level
    ``allgather_size``, or stage 0), as DeepSpeed reads it."""
    enabled = param_dict[ZERO_OPTIMIZATION]
    section: dict[str, Any] = {"stage": 1 if enabled else 0}
    if enabled:
        section["allgather_bucket_size"] = get_scalar_param(param_dict, "allgather_size", 5e8)
    return section


def get_zero_config(param_dict: dict[str, Any]) -> DeepSpeedZeroConfig:
    """The validated ``zero_optimization`` section of a whole config dict (defaults when absent), with
    DeepSpeed 0.19.8's defaults where they differ from ds's (``overlap_comm`` at stage 3)."""
    raw = {"train_batch_size": 1, ZERO_OPTIMIZATION: param_dict.get(ZERO_OPTIMIZATION, {})}
    if "allgather_size" in param_dict:
        raw["allgather_size"] = param_dict["allgather_size"]
    section = load_config(deepspeed_defaults(raw)).zero_optimization
    return view(section, DeepSpeedZeroConfig)

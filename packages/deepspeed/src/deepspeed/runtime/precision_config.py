"""DeepSpeed's ``deepspeed.runtime.precision_config``: the fp16/bf16 sections' models, over ds_config."""

from __future__ import annotations

from typing import Any

from ds_config import load_config

from deepspeed.runtime._config_source import deepspeed_defaults
from deepspeed.runtime._views import DeepSpeedBF16Config, DeepSpeedFP16Config, view
from deepspeed.runtime.config_utils import DeepSpeedConfigModel

__all__ = [
    "BFLOAT16",
    "CONSECUTIVE_HYSTERESIS",
    "DELAYED_SHIFT",
    "DeepSpeedConfigModel",
    "INITIAL_LOSS_SCALE",
    "MIN_LOSS_SCALE",
    "SCALE_WINDOW",
    "BFLOAT16_OLD",
    "FP16",
    "DeepSpeedBF16Config",
    "DeepSpeedFP16Config",
    "get_bfloat16_config",
    "get_float16_config",
]

FP16 = "fp16"
BFLOAT16 = "bf16"
BFLOAT16_OLD = "bfloat16"  # the section's older name, accepted as DeepSpeed does
# the dynamic loss scaler's argument names (DeepSpeedFP16Config.dynamic_loss_scale_args)
INITIAL_LOSS_SCALE = "init_scale"
SCALE_WINDOW = "scale_window"
DELAYED_SHIFT = "delayed_shift"
CONSECUTIVE_HYSTERESIS = "consecutive_hysteresis"
MIN_LOSS_SCALE = "min_scale"


def get_float16_config(param_dict: dict[str, Any]) -> DeepSpeedFP16Config:
    """The validated ``fp16`` section of a whole config dict (defaults when absent), with DeepSpeed 0.19.8's
    defaults where they differ from ds's (``initial_scale_power`` 16)."""
    raw = deepspeed_defaults({"train_batch_size": 1, FP16: param_dict.get(FP16, {})})
    return view(load_config(raw).fp16, DeepSpeedFP16Config)


def get_bfloat16_config(param_dict: dict[str, Any]) -> DeepSpeedBF16Config:
    """The validated ``bf16`` (or ``bfloat16``) section of a whole config dict (defaults when absent)."""
    section = param_dict.get(BFLOAT16, param_dict.get(BFLOAT16_OLD, {}))
    return view(load_config({"train_batch_size": 1, BFLOAT16: section}).bf16, DeepSpeedBF16Config)

"""DeepSpeed's ``deepspeed.runtime.precision_config``: the fp16/bf16 sections' models, over ds_config."""

from __future__ import annotations

from typing import Any

from ds_config import BF16Config, FP16Config, load_config

__all__ = [
    "BFLOAT16",
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
DeepSpeedFP16Config = FP16Config
DeepSpeedBF16Config = BF16Config


def get_float16_config(param_dict: dict[str, Any]) -> FP16Config:
    """The validated ``fp16`` section of a whole config dict (defaults when absent)."""
    return load_config({"train_batch_size": 1, FP16: param_dict.get(FP16, {})}).fp16


def get_bfloat16_config(param_dict: dict[str, Any]) -> BF16Config:
    """The validated ``bf16`` (or ``bfloat16``) section of a whole config dict (defaults when absent)."""
    section = param_dict.get(BFLOAT16, param_dict.get(BFLOAT16_OLD, {}))
    return load_config({"train_batch_size": 1, BFLOAT16: section}).bf16

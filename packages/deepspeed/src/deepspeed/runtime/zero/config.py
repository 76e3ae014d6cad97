"""DeepSpeed's ``deepspeed.runtime.zero.config``: the ZeRO section's models and enums, over ds_config.

``DeepSpeedZeroConfig`` is ds_config's ``ZeroConfig`` (field names are the JSON keys, as in DeepSpeed);
the offload sections likewise. ``ZeroStageEnum`` and ``OffloadDeviceEnum`` carry DeepSpeed's member
names and values, so ``config.stage == ZeroStageEnum.gradients`` holds for ds's int stage.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Any

from ds_config import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig, load_config

__all__ = [
    "ZERO_OPTIMIZATION",
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadDeviceEnum",
    "ZeroStageEnum",
    "get_zero_config",
]

ZERO_OPTIMIZATION = "zero_optimization"
DeepSpeedZeroConfig = ZeroConfig
DeepSpeedZeroOffloadParamConfig = OffloadParamConfig
DeepSpeedZeroOffloadOptimizerConfig = OffloadOptimizerConfig


class ZeroStageEnum(IntEnum):
    """What each ZeRO stage partitions (DeepSpeed's names)."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


class OffloadDeviceEnum(str, Enum):
    """Where an offloaded partition lives (``nvme`` is refused by ds's config: ZeRO-Infinity is not built)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


def get_zero_config(param_dict: dict[str, Any]) -> ZeroConfig:
    """The validated ``zero_optimization`` section of a whole config dict (defaults when absent)."""
    section = {ZERO_OPTIMIZATION: param_dict.get(ZERO_OPTIMIZATION, {})}
    return load_config({"train_batch_size": 1, **section}).zero_optimization

"""DeepSpeed's ``deepspeed.runtime.zero.offload_config``: the offload sections' models, over ds_config.

The models are ds_config's ``OffloadOptimizerConfig`` / ``OffloadParamConfig`` (see
``deepspeed.runtime._views``); ``nvme`` is accepted for ``offload_optimizer`` and ``offload_param`` at stage 3 (ds_zero's own swap files).
"""

from __future__ import annotations

from enum import Enum

from deepspeed.runtime._views import DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig

__all__ = [
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadDeviceEnum",
    "OffloadStateTypeEnum",
]


class OffloadDeviceEnum(str, Enum):
    """Where an offloaded partition lives (``nvme``: files under ``nvme_path``, stage 3 only)."""

    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    """The engine states DeepSpeed's ``offload_states`` names."""

    optim_states = "optim_states"
    hp_params = "hp_params"
    lp_params = "lp_params"
    lp_grads = "lp_grads"
    contiguous_grad_buffer = "contiguous_grad_buffer"

"""Adam/AdamW, LAMB, OneBitAdam, a fast CPU Adam, and the DeepSpeed LR schedules.

Build from the config's sections with ``build_optimizer(params, cfg.optimizer)`` and
``build_scheduler(optimizer, cfg.scheduler)``, or construct the classes directly.
"""

from ds_optim._build import (
    OptimizerConfigError,
    build_optimizer,
    build_scheduler,
    optimizer_from_config,
    scheduler_from_config,
)
from ds_optim._config_fields import CONFIG_FIELDS
from ds_optim._cpu_adam import CPUAdam
from ds_optim._deepspeed_adam import DeepSpeedCPUAdam, FusedAdam
from ds_optim._fused import prefer_fused_kernel
from ds_optim._lamb import Lamb
from ds_optim._onebit import OneBitAdam
from ds_optim._schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

__version__ = "0.1.0"
__all__ = [
    "CONFIG_FIELDS",
    "CPUAdam",
    "DeepSpeedCPUAdam",
    "FusedAdam",
    "LRRangeTest",
    "Lamb",
    "OneBitAdam",
    "OneCycle",
    "OptimizerConfigError",
    "WarmupCosineLR",
    "WarmupDecayLR",
    "WarmupLR",
    "__version__",
    "build_optimizer",
    "build_scheduler",
    "optimizer_from_config",
    "prefer_fused_kernel",
    "scheduler_from_config",
]

"""fp16 with dynamic/static loss scaling, bf16, and amp (apex when present, torch autocast otherwise)."""

from ._amp import amp_backward, amp_initialize
from ._config_fields import CONFIG_FIELDS
from ._optimizer import MixedPrecisionOptimizer
from ._scaler import (
    DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE,
    DynamicLossScaler,
    OverflowAtMinimumScaleError,
    StaticLossScaler,
    loss_scaler_from_config,
)

__version__ = "0.1.0"
__all__ = [
    "CONFIG_FIELDS",
    "DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE",
    "DynamicLossScaler",
    "MixedPrecisionOptimizer",
    "OverflowAtMinimumScaleError",
    "StaticLossScaler",
    "__version__",
    "amp_backward",
    "amp_initialize",
    "loss_scaler_from_config",
]

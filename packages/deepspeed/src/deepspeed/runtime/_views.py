"""DeepSpeed's config section classes as views over ds_config's models (one definition of every key).

Each class here *is* ds_config's section model (a subclass: the same fields, defaults and validation, so
``DeepSpeedZeroConfig(stage=3)`` is checked exactly as ``zero_optimization: {stage: 3}`` in a config file)
with DeepSpeed's attribute names on top: its field names where ds_config keeps the JSON key
(``prefetch_bucket_size`` for ``stage3_prefetch_bucket_size``), DeepSpeed's helper methods, and the fields
DeepSpeed has that ds does not implement, read at the value that says what ds does. ``view(section)``
turns a section ds_config already validated (``DSConfig.zero_optimization``) into its view without
validating again.
"""

from __future__ import annotations

import sys
from typing import Any, TypeVar

from ds_config import (
    BF16Config,
    FP16Config,
    OffloadOptimizerConfig,
    OffloadParamConfig,
    ZeroConfig,
)
from pydantic import BaseModel, Field, model_validator

__all__ = [
    "DeepSpeedBF16Config",
    "DeepSpeedFP16Config",
    "DeepSpeedZeroConfig",
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "view",
]

V = TypeVar("V", bound=BaseModel)


class DeepSpeedZeroOffloadParamConfig(OffloadParamConfig):
    """DeepSpeed's ``offload_param`` section: ds_config's ``OffloadParamConfig``."""


class DeepSpeedZeroOffloadOptimizerConfig(OffloadOptimizerConfig):
    """DeepSpeed's ``offload_optimizer`` section: ds_config's ``OffloadOptimizerConfig``."""


# DeepSpeed's ZeRO fields ds does not implement, at the value that describes ds (each key itself is refused
# by ds_config, or accepted only at this value)
_ZERO_FIXED = {
    "legacy_stage1": False,
    "pipeline_loading_checkpoint": False,
    "mics_shard_size": -1,
    "mics_hierarchical_params_gather": False,
    "model_persistence_threshold": sys.maxsize,  # no bound: ds keeps no whole-model persistence budget
    "use_all_reduce_for_fetch_params": False,
    "module_granularity_threshold": 0,
    "parameter_alignment": False,
}


class DeepSpeedZeroConfig(ZeroConfig):
    """DeepSpeed's ``zero_optimization`` section: ds_config's ``ZeroConfig`` with DeepSpeed's field names.

    Built from keyword arguments it takes either spelling (``prefetch_bucket_size=`` or
    ``stage3_prefetch_bucket_size=``), as DeepSpeed's model does; ``offload_optimizer`` / ``offload_param``
    read as :class:`DeepSpeedZeroOffloadOptimizerConfig` / :class:`DeepSpeedZeroOffloadParamConfig`.
    """

    @model_validator(mode="before")
    @classmethod
    def _deepspeed_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, key in ZeroConfig.KEY_ALIASES.items():
            if name in data:
                if key in data:
                    raise ValueError(f"'{name}' is another name for '{key}'; give only one of them")
                data[key] = data.pop(name)
        if data.get("stage") == 3 and data.get("overlap_comm") is None:
            data["overlap_comm"] = True  # DeepSpeed's default at stage 3 (False below it)
        return data

    @model_validator(mode="after")
    def _deepspeed_offload_classes(self) -> DeepSpeedZeroConfig:
        for name, cls in (
            ("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig),
            ("offload_param", DeepSpeedZeroOffloadParamConfig),
        ):
            section = getattr(self, name)
            if section is not None and not isinstance(section, cls):
                object.__setattr__(self, name, view(section, cls))
        return self

    def __getattr__(self, name: str) -> Any:
        key = ZeroConfig.KEY_ALIASES.get(name)
        if key is not None:
            return getattr(self, key)
        if name in _ZERO_FIXED:
            return _ZERO_FIXED[name]
        return super().__getattr__(name)  # type: ignore[misc]


class DeepSpeedFP16Config(FP16Config):
    """DeepSpeed's ``fp16`` section: ds_config's ``FP16Config`` with DeepSpeed's helper methods; built
    directly, its ``initial_scale_power`` default is DeepSpeed 0.19.8's 16 (ds's own config's is 32)."""

    initial_scale_power: int = Field(16, ge=0, le=64, description="Dynamic scaling starts at 2**this.")

    def initial_dynamic_scale(self) -> float:
        return 2**self.initial_scale_power

    def dynamic_loss_scale_args(self) -> dict[str, Any]:
        """The dynamic loss scaler's arguments under DeepSpeed's key names."""
        return {
            "init_scale": 2**self.initial_scale_power,
            "scale_window": self.loss_scale_window,
            "delayed_shift": self.hysteresis,
            "consecutive_hysteresis": self.consecutive_hysteresis,
            "min_scale": self.min_loss_scale,
        }


class DeepSpeedBF16Config(BF16Config):
    """DeepSpeed's ``bf16`` section: ds_config's ``BF16Config``."""


def view(section: BaseModel, cls: type[V]) -> V:
    """``section`` (a validated ds_config model) as ``cls``, its DeepSpeed view, without validating again."""
    values = {name: getattr(section, name) for name in type(section).model_fields}
    out = cls.model_construct(_fields_set=set(section.model_fields_set), **values)
    if isinstance(out, DeepSpeedZeroConfig):
        out._deepspeed_offload_classes()
    return out

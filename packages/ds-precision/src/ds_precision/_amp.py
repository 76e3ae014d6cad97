"""amp: NVIDIA apex when importable, otherwise opt levels O0-O3 on torch.autocast and our scaler.

Mapping without apex (documented in the README):

| level | model weights | forward | master weights | loss scale |
|---|---|---|---|---|
| O0 | fp32 | as is | (fp32 model) | static 1.0 |
| O1 | fp32 | autocast(half) | (fp32 model) | dynamic |
| O2 | half, norm layers fp32 | autocast(half) | fp32 | dynamic |
| O3 | half, everything | autocast(half) | none (pure half) | static 1.0 |
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Mapping
from typing import Any

import torch
from ds_config import AmpConfig

from ._optimizer import MixedPrecisionOptimizer
from ._scaler import DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE, DynamicLossScaler, StaticLossScaler

__all__ = ["amp_backward", "amp_initialize"]

logger = logging.getLogger("ds_precision")

OPT_LEVELS = ("O0", "O1", "O2", "O3")
# apex.amp.initialize keywords with no effect on the autocast path (autocast already does their job)
_IGNORED_WITHOUT_APEX = ("patch_torch_functions", "verbosity", "cast_model_outputs")
_APEX_DEFAULTS = {"verbosity": 1}  # the section always carries it; only another value is worth a warning
_KNOWN_KEYS = (
    "enabled",
    "opt_level",
    "cast_model_type",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
    "min_loss_scale",
    "max_loss_scale",
    "num_losses",
    *_IGNORED_WITHOUT_APEX,
)
_DTYPES = {
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "float": torch.float32,
}
_NORM_LAYERS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)


def _as_dict(config: AmpConfig | Mapping[str, Any]) -> dict[str, Any]:
    """The amp options: from the section model (each key read by name, plus its pass-through extra keys)
    or from a plain dict of ``apex.amp.initialize`` keywords."""
    if isinstance(config, Mapping):
        return dict(config)
    if not isinstance(config, AmpConfig):
        raise TypeError(f"amp config must be ds_config.AmpConfig or a dict, got {type(config).__name__}")
    return {
        "opt_level": config.opt_level,
        "cast_model_type": config.cast_model_type,
        "patch_torch_functions": config.patch_torch_functions,
        "keep_batchnorm_fp32": config.keep_batchnorm_fp32,
        "master_weights": config.master_weights,
        "loss_scale": config.loss_scale,
        "cast_model_outputs": config.cast_model_outputs,
        "num_losses": config.num_losses,
        "verbosity": config.verbosity,
        "min_loss_scale": config.min_loss_scale,
        "max_loss_scale": config.max_loss_scale,
        **(config.model_extra or {}),
    }


def _apex_amp() -> Any | None:
    try:
        return importlib.import_module("apex.amp")
    except ImportError:
        return None


def _dtype(value: Any) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    if str(value).removeprefix("torch.") in _DTYPES:
        return _DTYPES[str(value).removeprefix("torch.")]
    raise ValueError(f"amp.cast_model_type {value!r} is not a dtype; use one of {sorted(_DTYPES)}")


def amp_initialize(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: AmpConfig | Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.nn.Module, Any]:
    """Set up amp for ``model`` and ``optimizer``; return ``(model, optimizer)`` to train with.

    ``config`` is the ``amp`` section model (or a dict of the same keys); ``kwargs`` add to or override it.
    Every key except ``enabled`` goes to ``apex.amp.initialize`` when apex is importable. Without
    apex the opt levels run on ``torch.autocast``: the model's ``forward`` is wrapped in autocast
    (and cast for O2/O3), and the returned optimizer is a :class:`MixedPrecisionOptimizer`; call
    :func:`amp_backward` (or ``optimizer.backward(loss)``) for the scaled backward and check the
    ``bool`` returned by ``optimizer.step()`` before stepping an LR schedule.
    """
    options = {**(_as_dict(config) if config is not None else {}), **kwargs}
    options.pop("enabled", None)  # the engine's key: it decides whether amp is set up at all
    # a section model lists every known key, unset ones as None: None means "the level's default"
    options = {k: v for k, v in options.items() if v is not None}
    apex_amp = _apex_amp()
    if apex_amp is not None:
        return apex_amp.initialize(model, optimizer, **options)
    return _autocast_initialize(model, optimizer, options)


def _autocast_initialize(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, options: dict[str, Any]
) -> tuple[torch.nn.Module, MixedPrecisionOptimizer]:
    unknown = sorted(set(options) - set(_KNOWN_KEYS))
    if unknown:
        raise ValueError(
            f"amp keys {unknown} are not apex.amp.initialize options; known keys: {sorted(_KNOWN_KEYS)}"
        )
    level = options.get("opt_level", "O1")
    if level not in OPT_LEVELS:
        raise ValueError(f"amp.opt_level must be one of {list(OPT_LEVELS)}, got {level!r}")
    if int(options.get("num_losses", 1)) != 1:
        raise ValueError("amp.num_losses > 1 needs NVIDIA apex (pip install apex); without apex use one loss")
    ignored = [k for k in _IGNORED_WITHOUT_APEX if k in options and options[k] != _APEX_DEFAULTS.get(k)]
    if ignored:
        logger.warning("amp without apex: %s have no effect (torch.autocast chooses op precision)", ignored)
    half = _dtype(options.get("cast_model_type") or "float16")
    if half == torch.float32:
        level = "O0"
    if level in ("O2", "O3"):
        keep_norm_fp32 = options.get("keep_batchnorm_fp32")
        _cast_model(
            model, half, keep_norm_fp32=(level == "O2") if keep_norm_fp32 is None else bool(keep_norm_fp32)
        )
    if level != "O0":
        _autocast_forward(model, half)
    master = options.get("master_weights")
    master = (level == "O2") if master is None else bool(master)
    model_dtype = torch.float32 if level in ("O0", "O1") else half
    wrapped = MixedPrecisionOptimizer(
        optimizer,
        scaler=_amp_scaler(level, half, options),
        dtype=model_dtype,
        master_weights=master or model_dtype == torch.float32,
        module=model,
    )
    return model, wrapped


def _amp_scaler(
    level: str, half: torch.dtype, options: dict[str, Any]
) -> DynamicLossScaler | StaticLossScaler:
    default = "dynamic" if level in ("O1", "O2") and half == torch.float16 else 1.0
    loss_scale = options.get("loss_scale", default)
    if loss_scale == "dynamic":
        return DynamicLossScaler(
            min_loss_scale=float(options.get("min_loss_scale") or 1.0),
            max_loss_scale=float(options.get("max_loss_scale") or 2.0**24),  # apex's default cap
            max_overflows_at_min_scale=DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE,
        )
    return StaticLossScaler(float(loss_scale))


def _cast_model(model: torch.nn.Module, dtype: torch.dtype, *, keep_norm_fp32: bool) -> None:
    model.to(dtype)
    if keep_norm_fp32:
        for m in model.modules():
            if isinstance(m, _NORM_LAYERS):
                m.float()


def _autocast_forward(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Run ``model.forward`` under autocast on the model's device type (patched on the instance)."""
    device_type = next(model.parameters()).device.type
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kw: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kw)

    model.forward = autocast_forward


def amp_backward(loss: torch.Tensor, optimizer: Any) -> None:
    """Scaled backward for an optimizer returned by :func:`amp_initialize`, with or without apex."""
    if isinstance(optimizer, MixedPrecisionOptimizer):
        optimizer.backward(loss)
        return
    apex_amp = _apex_amp()
    if apex_amp is None:
        loss.backward()
        return
    with apex_amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()

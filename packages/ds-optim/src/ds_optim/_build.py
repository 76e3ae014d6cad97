"""Build an optimizer or LR schedule from the config's ``optimizer``/``scheduler`` section (or a name)."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from ds_config import OptimizerConfig, SchedulerConfig

from ds_optim._deepspeed_adam import DeepSpeedCPUAdam, FusedAdam
from ds_optim._fused import fused_kernel_supported
from ds_optim._lamb import Lamb
from ds_optim._onebit import OneBitAdam
from ds_optim._schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

__all__ = ["OptimizerConfigError", "build_optimizer", "build_scheduler"]

# DeepSpeed optimizer names (matched case-insensitively) that are not provided here.
DEEPSPEED_UNSUPPORTED = ("zerooneadam", "onebitlamb", "lion", "muadam", "muadamw", "musgd")
SCHEDULES = {cls.__name__: cls for cls in (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)}


class OptimizerConfigError(ValueError):
    """The optimizer or scheduler section names something unknown or carries an unusable parameter."""


def _torch_optimizer_names() -> list[str]:
    return sorted(
        name
        for name, obj in vars(torch.optim).items()
        if inspect.isclass(obj)
        and issubclass(obj, torch.optim.Optimizer)
        and obj is not torch.optim.Optimizer
    )


def _torch_scheduler_names() -> list[str]:
    base = torch.optim.lr_scheduler.LRScheduler
    return sorted(
        name
        for name, obj in vars(torch.optim.lr_scheduler).items()
        if inspect.isclass(obj) and issubclass(obj, base) and obj is not base and not name.startswith("_")
    )


def _split_section(
    section_or_type: str | OptimizerConfig | SchedulerConfig, params: Mapping[str, Any] | None, what: str
) -> tuple[str, dict]:
    """(type, params) from a name plus params, or from the ds_config section model."""
    if isinstance(section_or_type, str):
        return section_or_type, dict(params or {})
    if not isinstance(section_or_type, (OptimizerConfig, SchedulerConfig)):
        raise TypeError(
            f"the {what} must be named by a string or given as ds_config's {what} section model, "
            f"got {type(section_or_type).__name__}"
        )
    return section_or_type.type, {**section_or_type.params, **(params or {})}


def _check_kwargs(cls: Any, kwargs: Mapping[str, Any], name: str, what: str, skip: int) -> None:
    """Fail with the accepted names when ``kwargs`` has a key the constructor does not take."""
    sig = inspect.signature(cls.__init__)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    accepted = [n for n in list(sig.parameters)[skip:] if n != "process_group"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise OptimizerConfigError(
            f"{what} {name!r}: unknown params {unknown}; accepted params: {', '.join(accepted)}"
        )


def _materialise(params: Iterable[Any]) -> list[Any]:
    params = list(params)
    if not params:
        raise OptimizerConfigError("the optimizer got an empty parameter list")
    return params


def _all_tensors(params: list[Any]) -> list[torch.Tensor]:
    if isinstance(params[0], dict):
        return [p for g in params for p in g["params"]]
    return params


def _build_adam(params: list[Any], opts: dict[str, Any], adamw_type: bool, cpu_offload: bool) -> Any:
    """DeepSpeed's Adam/AdamW: decoupled decay unless ``adam_w_mode`` is false (and type is not AdamW).

    As in DeepSpeed: ``torch_adam: true`` builds ``torch.optim.AdamW``/``Adam`` from the remaining params
    (torch's defaults then apply: AdamW's weight_decay is 0.01); otherwise ZeRO offload builds
    ``DeepSpeedCPUAdam`` (``fp32_optimizer_states`` passes through) and everything else ``FusedAdam``
    (weight_decay 0 by default). All of them step on torch's fused Adam kernel where it takes the tensors.
    """
    torch_adam = bool(opts.pop("torch_adam", False))
    adam_w_mode = bool(opts.pop("adam_w_mode", True))
    decoupled = adamw_type or adam_w_mode
    if torch_adam:
        cls = torch.optim.AdamW if decoupled else torch.optim.Adam
        _check_kwargs(cls, opts, "Adam", "optimizer (torch_adam: true builds torch.optim's class)", skip=2)
        if "fused" not in opts and "foreach" not in opts and not opts.get("amsgrad", False):
            # same math as torch's default foreach path, ~10x faster on CPU (see _fused.py)
            opts["fused"] = True if fused_kernel_supported(_all_tensors(params)) else None
        return cls(params, **opts)
    if cpu_offload:
        _check_kwargs(DeepSpeedCPUAdam, opts, "Adam", "optimizer", skip=2)
        return DeepSpeedCPUAdam(params, adamw_mode=decoupled, **opts)
    _check_kwargs(FusedAdam, opts, "Adam", "optimizer", skip=2)
    return FusedAdam(params, adam_w_mode=decoupled, **opts)


def build_optimizer(
    params: Iterable[Any],
    optimizer_section_or_type: str | OptimizerConfig,
    params_dict: Mapping[str, Any] | None = None,
    *,
    process_group: Any = None,
    cpu_offload: bool = False,
) -> torch.optim.Optimizer:
    """Build the optimizer named by a config section (``type``, ``params``) or by a type name.

    Types: Adam (AdamW-style unless ``adam_w_mode: false``), AdamW, Lamb, OneBitAdam, Adagrad, or any
    ``torch.optim`` class by its exact name. ``cpu_offload=True`` (ZeRO offload) builds ``CPUAdam`` for
    Adam/AdamW. ``process_group`` is OneBitAdam's data-parallel group (default: the world).
    """
    name, opts = _split_section(optimizer_section_or_type, params_dict, "optimizer")
    if "max_grad_norm" in opts:
        raise OptimizerConfigError(
            "'max_grad_norm' is not supported as an optimizer parameter; remove it from optimizer.params and "
            'set the top-level "gradient_clipping" key instead'
        )
    params = _materialise(params)
    lowered = name.lower()
    if lowered in ("adam", "adamw"):
        return _build_adam(params, opts, lowered == "adamw", cpu_offload)
    if lowered == "lamb":
        _check_kwargs(Lamb, opts, name, "optimizer", skip=2)
        return Lamb(params, **opts)
    if lowered == "onebitadam":
        _check_kwargs(OneBitAdam, opts, name, "optimizer", skip=2)
        return OneBitAdam(params, process_group=process_group, **opts)
    if lowered == "adagrad":
        name = "Adagrad"
    if lowered in DEEPSPEED_UNSUPPORTED:
        raise OptimizerConfigError(
            f"optimizer {name!r} is a DeepSpeed optimizer that ds_optim does not provide; "
            f"use one of {_known_optimizers()}"
        )
    cls = getattr(torch.optim, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer)):
        raise OptimizerConfigError(f"{name!r} is not a supported optimizer; known: {_known_optimizers()}")
    _check_kwargs(cls, opts, name, "optimizer", skip=2)
    return cls(params, **opts)


def _known_optimizers() -> str:
    ours = ["Adam", "AdamW", "Lamb", "OneBitAdam", "Adagrad"]
    torch_names = [n for n in _torch_optimizer_names() if n not in ours]
    return ", ".join(ours + [f"torch.optim.{n}" for n in torch_names])


def build_scheduler(
    optimizer: Any, scheduler_section_or_type: str | SchedulerConfig, params: Mapping[str, Any] | None = None
) -> Any:
    """Build the LR schedule named by a config section (``type``, ``params``) or by a type name.

    DeepSpeed's schedules come first, then ``torch.optim.lr_scheduler`` classes by exact name. Pass the
    optimizer the engine steps (a wrapper with ``.optimizer`` is unwrapped for torch's schedulers).
    Call the schedule's ``step()`` only after an optimizer step really happened.
    """
    name, opts = _split_section(scheduler_section_or_type, params, "scheduler")
    if name in SCHEDULES:
        cls = SCHEDULES[name]
        _check_kwargs(cls, opts, name, "scheduler", skip=2)
        return cls(optimizer, **opts)
    cls = getattr(torch.optim.lr_scheduler, name, None)
    if not (inspect.isclass(cls) and issubclass(cls, torch.optim.lr_scheduler.LRScheduler)):
        known = list(SCHEDULES) + [f"torch.optim.lr_scheduler.{n}" for n in _torch_scheduler_names()]
        raise OptimizerConfigError(f"LR scheduler {name!r} is not recognised; known: {', '.join(known)}")
    if not isinstance(optimizer, torch.optim.Optimizer) and isinstance(
        getattr(optimizer, "optimizer", None), torch.optim.Optimizer
    ):
        optimizer = optimizer.optimizer
    _check_kwargs(cls, opts, name, "scheduler", skip=2)
    return cls(optimizer, **opts)


def optimizer_from_config(
    params: Iterable[Any], section: OptimizerConfig, **kwargs: Any
) -> torch.optim.Optimizer:
    """``build_optimizer`` for the ``optimizer`` section (``type`` and ``params``)."""
    if not isinstance(section, OptimizerConfig):
        raise TypeError(
            f"optimizer_from_config takes ds_config.OptimizerConfig, got {type(section).__name__}"
        )
    return build_optimizer(params, section, **kwargs)


def scheduler_from_config(optimizer: Any, section: SchedulerConfig) -> Any:
    """``build_scheduler`` for the ``scheduler`` section (``type`` and ``params``)."""
    if not isinstance(section, SchedulerConfig):
        raise TypeError(
            f"scheduler_from_config takes ds_config.SchedulerConfig, got {type(section).__name__}"
        )
    return build_scheduler(optimizer, section)

"""DeepSpeed's ``deepspeed.utils.safe_get_*`` / ``safe_set_*``: one parameter's fp32 values under any ZeRO stage.

A parameter trained by a ZeRO optimizer (stage 1, 2 or 3) is served by that optimizer's
``ds_zero.ParamFragments`` methods (found with ``ds_zero.optimizer_of``); the full getters and setters are
then collective: every data-parallel rank calls them for the same parameter. Elsewhere (stage 0, a frozen
parameter) they act as DeepSpeed's do on a parameter without a partitioned fp32 copy: the gradient is
``param.grad``, the fp32 master and optimizer state are None, and the setters of those do nothing. The
``*_local_*`` variants exist for ZeRO-3 parameters only, as in DeepSpeed (an ``AssertionError`` elsewhere).
"""

from __future__ import annotations

import ds_zero
import torch
from torch import nn

__all__ = [
    "safe_get_full_fp32_param",
    "safe_get_full_grad",
    "safe_get_full_optimizer_state",
    "safe_get_local_fp32_param",
    "safe_get_local_grad",
    "safe_get_local_optimizer_state",
    "safe_set_full_fp32_param",
    "safe_set_full_grad",
    "safe_set_full_optimizer_state",
    "safe_set_local_fp32_param",
    "safe_set_local_grad",
    "safe_set_local_optimizer_state",
]

NO_GRADIENT = "Gradients are only available immediately after backward and before engine step"


def safe_get_full_grad(param: nn.Parameter) -> torch.Tensor | None:
    """The parameter's gradient averaged over the data-parallel ranks, whole, in fp32 (collective under ZeRO).

    Call it between ``engine.backward`` at an accumulation boundary and ``engine.step``. Under fp16 it is
    still multiplied by the loss scale, as in DeepSpeed. Without ZeRO it is ``param.grad`` (already
    averaged by the boundary backward).
    """
    owner = ds_zero.optimizer_of(param)
    if owner is None:
        return param.grad
    grad = owner.full_grad(param)
    if grad is None:
        raise ValueError(NO_GRADIENT)
    return grad


def safe_get_full_fp32_param(param: nn.Parameter) -> torch.Tensor | None:
    """The parameter's fp32 master weights, whole (collective under ZeRO); None without ZeRO."""
    owner = ds_zero.optimizer_of(param)
    return owner.full_fp32_param(param) if owner is not None else None


def safe_get_full_optimizer_state(param: nn.Parameter, optim_state_key: str) -> torch.Tensor | None:
    """The optimizer's state ``optim_state_key`` (``"exp_avg"``, ``"exp_avg_sq"``) of the parameter, whole,
    fp32 (collective under ZeRO); None without ZeRO."""
    owner = ds_zero.optimizer_of(param)
    return owner.full_optimizer_state(param, optim_state_key) if owner is not None else None


def safe_set_full_fp32_param(param: nn.Parameter, value: torch.Tensor) -> None:
    """Overwrite the parameter's fp32 master with ``value`` (whole; every rank passes the same). The model's
    low-precision weights take it at the next step. Does nothing without ZeRO, as in DeepSpeed."""
    owner = ds_zero.optimizer_of(param)
    if owner is not None:
        owner.set_full_fp32_param(param, value)


def safe_set_full_optimizer_state(param: nn.Parameter, value: torch.Tensor, optim_state_key: str) -> None:
    """Overwrite the optimizer state ``optim_state_key`` of the parameter (whole; every rank passes the same)."""
    owner = ds_zero.optimizer_of(param)
    if owner is not None:
        owner.set_full_optimizer_state(param, value, optim_state_key)


def safe_set_full_grad(param: nn.Parameter, value: torch.Tensor) -> None:
    """Make ``value`` the parameter's averaged gradient for the coming step (whole; every rank passes the same).

    Without ZeRO it is copied into ``param.grad`` when there is one.
    """
    owner = ds_zero.optimizer_of(param)
    if owner is not None:
        owner.set_full_grad(param, value)
    elif param.grad is not None:
        param.grad.copy_(value)


def safe_get_local_grad(param: nn.Parameter) -> torch.Tensor | None:
    """This rank's piece of a ZeRO-3 parameter's averaged gradient (flat, fp32)."""
    grad = _stage3_owner(param).local_grad(param)
    if grad is None:
        raise ValueError(NO_GRADIENT)
    return grad


def safe_get_local_fp32_param(param: nn.Parameter) -> torch.Tensor:
    """This rank's piece of a ZeRO-3 parameter's fp32 master (flat)."""
    return _stage3_owner(param).local_fp32_param(param)


def safe_get_local_optimizer_state(param: nn.Parameter, optim_state_key: str) -> torch.Tensor:
    """This rank's piece of a ZeRO-3 parameter's optimizer state ``optim_state_key`` (flat)."""
    return _stage3_owner(param).local_optimizer_state(param, optim_state_key)


def safe_set_local_grad(param: nn.Parameter, value: torch.Tensor) -> None:
    """Overwrite this rank's piece of a ZeRO-3 parameter's averaged gradient."""
    _stage3_owner(param).set_local_grad(param, value)


def safe_set_local_fp32_param(param: nn.Parameter, value: torch.Tensor) -> None:
    """Overwrite this rank's piece of a ZeRO-3 parameter's fp32 master."""
    _stage3_owner(param).set_local_fp32_param(param, value)


def safe_set_local_optimizer_state(param: nn.Parameter, value: torch.Tensor, optim_state_key: str) -> None:
    """Overwrite this rank's piece of a ZeRO-3 parameter's optimizer state ``optim_state_key``."""
    _stage3_owner(param).set_local_optimizer_state(param, value, optim_state_key)


def _stage3_owner(param: nn.Parameter) -> ds_zero.ZeroStage3Optimizer:
    owner = ds_zero.optimizer_of(param)
    if not isinstance(owner, ds_zero.ZeroStage3Optimizer):
        # DeepSpeed asserts the same, with this message
        raise ds_zero.ZeroAssertionError("This API is only defined for ZeRO-3 partitioned parameters")
    return owner

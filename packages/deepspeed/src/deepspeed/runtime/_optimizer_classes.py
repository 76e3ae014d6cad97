"""DeepSpeed's optimizer class names, as classes whose ``isinstance`` holds for the optimizer ds builds.

DeepSpeed's engine wraps the client optimizer in one of its own classes, and code asks which with
``isinstance`` (Lightning: ``isinstance(x, DeepSpeedOptimizer)`` to find optimizer state; user code:
``isinstance(engine.optimizer, DeepSpeedZeroOptimizer)``). ds builds ``ds_zero.ZeroOptimizer`` at ZeRO 1/2,
``ds_zero.ZeroStage3Optimizer`` at 3, and ``ds_precision.MixedPrecisionOptimizer`` below ZeRO. The ZeRO
classes are mapped as themselves. Below ZeRO one ds class stands for several of DeepSpeed's, so the names
here answer ``isinstance`` by what DeepSpeed 0.19.8 builds for the same configuration (recorded:
packages/deepspeed/tests/fixtures/deepspeed_0.19.8_surface.json, "behaviour"):

- fp32 below ZeRO: DeepSpeed steps the client optimizer itself; ds's fp32 wrapper is none of these classes.
- fp16/bf16 below ZeRO: ``FP16_Optimizer`` when the inner optimizer is a fused Adam (ds_optim.FusedAdam,
  DeepSpeed's rule), ``FP16_UnfusedOptimizer`` otherwise (recorded: bf16 with a torch AdamW).
- ``BF16_Optimizer`` (bf16 weights, fp32 gradient accumulation): DeepSpeed builds it at ZeRO 1 with
  ``grad_accum_dtype`` fp32 (recorded), where ds builds its ZeroOptimizer (so ``DeepSpeedZeroOptimizer`` holds
  too in ds, not in DeepSpeed); below ZeRO, ds's MixedPrecisionOptimizer in bf16 with fp32 accumulation
  (a mix DeepSpeed 0.19.8 refuses at stage 0).

Constructing one of these directly is not supported: ds builds the optimizer in ``initialize()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import ds_optim
import ds_precision
import ds_zero
import torch
from ds_engine._missing import FeatureNotAvailableError

__all__ = ["BF16_Optimizer", "DeepSpeedOptimizer", "FP16_Optimizer", "FP16_UnfusedOptimizer", "ZeROOptimizer"]


class _InstanceOf(type):
    """A class whose ``isinstance`` is its ``_matches(obj)`` predicate (no wrapper objects involved)."""

    _matches: Callable[[Any], bool]

    def __instancecheck__(cls, obj: Any) -> bool:
        return cls._matches(obj)

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise FeatureNotAvailableError(
            f"constructing DeepSpeed's {cls.__name__} directly is not available in ds (DeepSpeed has it, ds does "
            "not): ds builds the optimizer wrapper in deepspeed.initialize() from the config "
            f"({cls.__doc__.strip()}); pass your torch optimizer to initialize() instead"
        )


def _low_precision(obj: Any) -> bool:
    return isinstance(obj, ds_precision.MixedPrecisionOptimizer) and obj.dtype in (
        torch.float16,
        torch.bfloat16,
    )


def _bf16_fp32_accum(obj: Any) -> bool:
    if isinstance(obj, ds_zero.ZeroOptimizer):  # ZeRO 1 with fp32 accumulation (only set under bf16)
        return obj.stage == 1 and obj.options.grad_accum_dtype == torch.float32
    return _low_precision(obj) and obj.dtype == torch.bfloat16 and obj.fp32_grad_accum


def _fused(obj: Any) -> bool:
    return _low_precision(obj) and not _bf16_fp32_accum(obj) and isinstance(obj.optimizer, ds_optim.FusedAdam)


def _unfused(obj: Any) -> bool:
    return (
        _low_precision(obj)
        and not _bf16_fp32_accum(obj)
        and not isinstance(obj.optimizer, ds_optim.FusedAdam)
    )


def _zero(obj: Any) -> bool:
    return isinstance(obj, (ds_zero.ZeroOptimizer, ds_zero.ZeroStage3Optimizer))


class BF16_Optimizer(metaclass=_InstanceOf):  # noqa: N801 - DeepSpeed's name
    """bf16 with fp32 gradient accumulation: ds_zero.ZeroOptimizer at stage 1, MixedPrecisionOptimizer below ZeRO"""

    _matches = staticmethod(_bf16_fp32_accum)


class FP16_Optimizer(metaclass=_InstanceOf):  # noqa: N801 - DeepSpeed's name
    """fp16/bf16 below ZeRO over a fused Adam: ds_precision.MixedPrecisionOptimizer"""

    _matches = staticmethod(_fused)


class FP16_UnfusedOptimizer(metaclass=_InstanceOf):  # noqa: N801 - DeepSpeed's name
    """fp16/bf16 below ZeRO over any other optimizer: ds_precision.MixedPrecisionOptimizer"""

    _matches = staticmethod(_unfused)


class ZeROOptimizer(metaclass=_InstanceOf):
    """ZeRO 1-3: ds_zero.ZeroOptimizer and ds_zero.ZeroStage3Optimizer"""

    _matches = staticmethod(_zero)


class DeepSpeedOptimizer(metaclass=_InstanceOf):
    """every optimizer wrapper DeepSpeed builds: ZeRO 1-3 and bf16/fp16 below ZeRO"""

    _matches = staticmethod(lambda obj: _zero(obj) or _low_precision(obj))

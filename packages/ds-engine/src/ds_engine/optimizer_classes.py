"""DeepSpeed's optimizer class names, as classes whose ``isinstance`` holds for the optimizer ds builds.

DeepSpeed's engine wraps the client optimizer in one of its own classes, and code asks which with
``isinstance`` (Lightning: ``isinstance(x, DeepSpeedOptimizer)`` to find optimizer state; user code:
``isinstance(engine.optimizer, BF16_Optimizer)``). ds builds ``ds_zero.ZeroOptimizer`` at ZeRO 1/2,
``ds_zero.ZeroStage3Optimizer`` at 3, and ``ds_precision.MixedPrecisionOptimizer`` below ZeRO, whose
``dtype`` says what DeepSpeed would have built (bf16: ``BF16_Optimizer``, fp16: ``FP16_Optimizer``; fp32:
DeepSpeed steps the client optimizer itself, and ds's fp32 wrapper is none of DeepSpeed's classes).

The ZeRO classes are mapped as themselves (``deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer is
ds_zero.ZeroOptimizer``). The classes below are answered by a predicate on the instance, since one ds class
stands for several of DeepSpeed's. Constructing one directly is not supported: ds builds its optimizer in
``initialize()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import ds_precision
import ds_zero
import torch

from ds_engine._missing import FeatureNotAvailableError

__all__ = ["BF16_Optimizer", "DeepSpeedOptimizer", "FP16_Optimizer", "ZeROOptimizer"]


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


def _precision(dtype: torch.dtype) -> Callable[[Any], bool]:
    return lambda obj: isinstance(obj, ds_precision.MixedPrecisionOptimizer) and obj.dtype == dtype


def _zero(obj: Any) -> bool:
    return isinstance(obj, (ds_zero.ZeroOptimizer, ds_zero.ZeroStage3Optimizer))


class BF16_Optimizer(metaclass=_InstanceOf):  # noqa: N801 - DeepSpeed's name
    """bf16 below ZeRO: ds_precision.MixedPrecisionOptimizer with dtype bfloat16"""

    _matches = staticmethod(_precision(torch.bfloat16))


class FP16_Optimizer(metaclass=_InstanceOf):  # noqa: N801 - DeepSpeed's name
    """fp16 below ZeRO: ds_precision.MixedPrecisionOptimizer with dtype float16"""

    _matches = staticmethod(_precision(torch.float16))


class ZeROOptimizer(metaclass=_InstanceOf):
    """ZeRO 1-3: ds_zero.ZeroOptimizer and ds_zero.ZeroStage3Optimizer"""

    _matches = staticmethod(_zero)


class DeepSpeedOptimizer(metaclass=_InstanceOf):
    """every optimizer wrapper DeepSpeed builds: ZeRO 1-3 and bf16/fp16 below ZeRO"""

    _matches = staticmethod(
        lambda obj: _zero(obj) or _precision(torch.bfloat16)(obj) or _precision(torch.float16)(obj)
    )

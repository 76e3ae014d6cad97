"""Loss scalers: dynamic (V19 growth rule with hysteresis) and static.

Both satisfy the loss-scaler protocol of docs/architecture.md: a ``loss_scale`` property, one
``update_scale(overflow)`` call per optimizer step, and a state dict of plain numbers.
"""

from __future__ import annotations

import math
from typing import Any

from ds_config import FP16Config, LossScaleConfig

__all__ = [
    "DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE",
    "DynamicLossScaler",
    "OverflowAtMinimumScaleError",
    "StaticLossScaler",
    "loss_scaler_from_config",
]

# A run that overflows this many steps in a row with nothing left to lower is stuck: every step is
# being skipped, so continuing only burns compute.
DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE = 10  # = ds_config FP16Config.max_overflows_at_min_scale
SCALE_FACTOR = 2.0


class OverflowAtMinimumScaleError(RuntimeError):
    """Gradients kept overflowing although the loss scale could not be lowered any further.

    ``param_names`` lists the parameters whose gradients held inf/nan on this rank (empty when the
    scaler alone raised it and nobody with parameter names has added them yet).
    """

    def __init__(self, scale: float, consecutive: int, param_names: tuple[str, ...] = ()) -> None:
        self.scale = scale
        self.consecutive = consecutive
        self.param_names = tuple(param_names)
        super().__init__(self._message())

    def _message(self) -> str:
        if self.param_names:
            shown = ", ".join(self.param_names[:10])
            more = f" (and {len(self.param_names) - 10} more)" if len(self.param_names) > 10 else ""
            where = f"parameters with inf/nan gradients: {shown}{more}"
        else:
            where = "no parameter on this rank held inf/nan gradients (the overflow came from another rank)"
        return (
            f"gradients overflowed (inf/nan) on {self.consecutive} consecutive steps at loss scale "
            f"{self.scale:g}, which cannot be lowered further; {where}. fp16 cannot represent these "
            'gradients: train in bf16 instead ("bf16": {"enabled": true}), or look for inf/nan in the '
            "data or loss, or lower the learning rate. To let the run continue longer, raise "
            "max_overflows_at_min_scale."
        )

    def with_param_names(self, names: tuple[str, ...]) -> OverflowAtMinimumScaleError:
        """The same error, naming ``names`` as the parameters whose gradients overflowed."""
        return OverflowAtMinimumScaleError(self.scale, self.consecutive, names)


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


class _OverflowStreak:
    """Counts consecutive overflows at the minimum scale and stops the run after a limit."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_overflows_at_min_scale must be >= 1, got {limit!r}")
        self.limit = limit
        self.count = 0

    def record(self, overflow: bool, at_minimum: bool, scale: float) -> None:
        self.count = self.count + 1 if overflow and at_minimum else 0
        if self.count >= self.limit:
            raise OverflowAtMinimumScaleError(scale, self.count)


class DynamicLossScaler:
    """Dynamic loss scale: halve on overflow (after ``hysteresis`` overflows), double when stable.

    Growth follows DeepSpeed 0.19 (docs/design.md §2, rule A): with ``stable`` = steps since the last
    overflow minus one, the scale doubles when ``stable > 0 and stable % loss_scale_window == 0``,
    i.e. on the (window+1)-th consecutive clean step. ``hysteresis`` overflows are tolerated before
    the first halving; ``consecutive_hysteresis`` refills that budget on every clean step instead of
    only at growth. At ``min_loss_scale`` an overflow only skips the step; after
    ``max_overflows_at_min_scale`` such overflows in a row ``update_scale`` raises
    :class:`OverflowAtMinimumScaleError`.
    """

    dynamic = True
    scale_factor = SCALE_FACTOR  # DeepSpeed's attribute: the factor of each halving and doubling

    def __init__(
        self,
        *,
        initial_scale_power: int = 32,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        consecutive_hysteresis: bool = False,
        min_loss_scale: float = 1.0,
        max_loss_scale: float = math.inf,
        max_overflows_at_min_scale: int = DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE,
    ) -> None:
        if loss_scale_window < 1:
            raise ValueError(f"loss_scale_window must be >= 1, got {loss_scale_window!r}")
        if hysteresis < 1:
            raise ValueError(f"hysteresis must be >= 1, got {hysteresis!r}")
        _check_positive("min_loss_scale", min_loss_scale)
        if max_loss_scale < min_loss_scale:
            raise ValueError(f"max_loss_scale ({max_loss_scale}) is below min_loss_scale ({min_loss_scale})")
        self.scale_window = int(loss_scale_window)
        self.delayed_shift = int(hysteresis)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.min_scale = float(min_loss_scale)
        self.max_scale = float(max_loss_scale)
        self.cur_scale = min(max(2.0**initial_scale_power, self.min_scale), self.max_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.cur_hysteresis = self.delayed_shift
        self._streak = _OverflowStreak(max_overflows_at_min_scale)

    @classmethod
    def from_config(cls, fp16: FP16Config) -> DynamicLossScaler:
        """Build from the ``fp16`` section model."""
        return cls(
            initial_scale_power=fp16.initial_scale_power,
            loss_scale_window=fp16.loss_scale_window,
            hysteresis=fp16.hysteresis,
            consecutive_hysteresis=fp16.consecutive_hysteresis,
            min_loss_scale=fp16.min_loss_scale,
            max_overflows_at_min_scale=fp16.max_overflows_at_min_scale,
        )

    @property
    def loss_scale(self) -> float:
        """Multiply the loss by this before backward."""
        return self.cur_scale

    @property
    def overflows_at_min_scale(self) -> int:
        """Consecutive overflows seen while the scale sat at its minimum."""
        return self._streak.count

    @property
    def loss_scale_config(self) -> LossScaleConfig:
        """This scaler's settings and state under DeepSpeed's names (``optimizer.loss_scale_config``)."""
        return LossScaleConfig(
            use_grad_scaling=True,
            dynamic_loss_scale=True,
            cur_iter=self.cur_iter,
            cur_scale=self.cur_scale,
            last_overflow_iter=self.last_overflow_iter,
            scale_factor=self.scale_factor,
            scale_window=self.scale_window,
            min_loss_scale=self.min_scale,
        )

    def update_scale(self, overflow: bool) -> None:
        """Advance one optimizer step; ``overflow`` says whether any gradient held inf/nan."""
        at_minimum = self.cur_scale <= self.min_scale
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.cur_scale = max(self.cur_scale / SCALE_FACTOR, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable = self.cur_iter - self.last_overflow_iter - 1
            if stable > 0 and stable % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale = min(self.cur_scale * SCALE_FACTOR, self.max_scale)
        self.cur_iter += 1
        self._streak.record(overflow, at_minimum, self.cur_scale)

    def state_dict(self) -> dict[str, Any]:
        """Counters and the current scale, as plain numbers."""
        return {
            "dynamic": True,
            "cur_scale": self.cur_scale,
            "cur_iter": self.cur_iter,
            "last_overflow_iter": self.last_overflow_iter,
            "cur_hysteresis": self.cur_hysteresis,
            "overflows_at_min_scale": self._streak.count,
            "scale_window": self.scale_window,
            "delayed_shift": self.delayed_shift,
            "min_scale": self.min_scale,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters and scale; the configuration of this run (window, minimum...) is kept."""
        if not state.get("dynamic", False):
            raise ValueError(
                "cannot load a static loss scaler's state into a DynamicLossScaler: the checkpoint was "
                "saved with a fixed fp16.loss_scale; set the same loss_scale or start the scaler afresh"
            )
        self.cur_scale = float(state["cur_scale"])
        self.cur_iter = int(state["cur_iter"])
        self.last_overflow_iter = int(state["last_overflow_iter"])
        self.cur_hysteresis = int(state["cur_hysteresis"])
        self._streak.count = int(state.get("overflows_at_min_scale", 0))

    def __repr__(self) -> str:
        return (
            f"DynamicLossScaler(scale={self.cur_scale:g}, window={self.scale_window}, "
            f"hysteresis={self.cur_hysteresis}/{self.delayed_shift}, min={self.min_scale:g})"
        )


class StaticLossScaler:
    """A fixed loss scale. Overflows are still detected (the step is skipped), the scale never moves.

    After ``max_overflows_at_min_scale`` overflows in a row ``update_scale`` raises
    :class:`OverflowAtMinimumScaleError`: a fixed scale is its own minimum.
    """

    dynamic = False

    def __init__(
        self,
        loss_scale: float = 1.0,
        *,
        max_overflows_at_min_scale: int = DEFAULT_MAX_OVERFLOWS_AT_MIN_SCALE,
    ) -> None:
        _check_positive("loss_scale", loss_scale)
        self.cur_scale = float(loss_scale)
        self.cur_iter = 0  # steps seen, as DeepSpeed's loss_scale_config counts them for a static scale too
        self._streak = _OverflowStreak(max_overflows_at_min_scale)

    @classmethod
    def from_config(cls, fp16: FP16Config) -> StaticLossScaler:
        """Build from the ``fp16`` section model; ``fp16.loss_scale`` must be > 0."""
        return cls(fp16.loss_scale, max_overflows_at_min_scale=fp16.max_overflows_at_min_scale)

    @property
    def loss_scale(self) -> float:
        """Multiply the loss by this before backward."""
        return self.cur_scale

    @property
    def overflows_at_min_scale(self) -> int:
        """Consecutive overflows seen (a static scale is always at its minimum)."""
        return self._streak.count

    @property
    def loss_scale_config(self) -> LossScaleConfig:
        """The fixed scale under DeepSpeed's names (``optimizer.loss_scale_config``; no dynamic fields)."""
        return LossScaleConfig(
            use_grad_scaling=True, dynamic_loss_scale=False, cur_iter=self.cur_iter, cur_scale=self.cur_scale
        )

    def update_scale(self, overflow: bool) -> None:
        """Record one optimizer step; the scale itself never changes."""
        self.cur_iter += 1
        self._streak.record(overflow, True, self.cur_scale)

    def state_dict(self) -> dict[str, Any]:
        """The scale, as plain numbers."""
        return {
            "dynamic": False,
            "cur_scale": self.cur_scale,
            "cur_iter": self.cur_iter,
            "overflows_at_min_scale": self._streak.count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step count and the overflow streak; the configured scale of this run is kept."""
        self.cur_iter = int(state.get("cur_iter", 0))
        self._streak.count = int(state.get("overflows_at_min_scale", 0))

    def __repr__(self) -> str:
        return f"StaticLossScaler(scale={self.cur_scale:g})"


def loss_scaler_from_config(fp16: FP16Config) -> DynamicLossScaler | StaticLossScaler:
    """The scaler an ``fp16`` section asks for: dynamic when ``loss_scale`` is 0, else static."""
    if not isinstance(fp16, FP16Config):
        raise TypeError(f"loss_scaler_from_config takes ds_config.FP16Config, got {type(fp16).__name__}")
    if fp16.loss_scale == 0:
        return DynamicLossScaler.from_config(fp16)
    if fp16.loss_scale < 0:
        raise ValueError(
            f"fp16.loss_scale must be 0 (dynamic) or a positive fixed scale, got {fp16.loss_scale!r}"
        )
    return StaticLossScaler.from_config(fp16)

"""DeepSpeed's LR schedules: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest.

Contract with the engine: ``step()`` is called once after every optimizer step that really happened (at a
gradient-accumulation boundary and not skipped for an fp16 overflow). ``step(i)`` jumps to iteration ``i``.
After the k-th call to ``step()`` the schedule's iteration is ``k - 1`` and every param group's ``lr`` holds
``lr(k - 1)``. At construction (iteration -1) every schedule writes its first value (``lr(0)``) into the
optimizer, so the first optimizer step already follows the schedule (DeepSpeed <= 0.14 left the optimizer's
own ``lr`` for that step and returned ``[0.0]`` from ``get_lr()``; that is not reproduced).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from ds_config import SchedulerConfig

__all__ = ["LRRangeTest", "OneCycle", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]

WARMUP_TYPES = ("log", "linear")


def _torch_optimizer(optimizer: Any) -> Any:
    """The object whose ``param_groups`` the schedule writes: the optimizer, or the one a wrapper holds."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer):
        return inner
    if hasattr(optimizer, "param_groups"):
        return optimizer
    raise TypeError(
        f"{type(optimizer).__name__} is not a torch.optim.Optimizer and has no `.optimizer` or `param_groups`; "
        "pass the optimizer (or the engine's wrapped optimizer) to the LR schedule"
    )


def _per_group(optimizer: Any, value: float | Sequence[float], name: str) -> list[float]:
    """Broadcast a scalar to every param group; a list must have one entry per group."""
    n_groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n_groups:
            raise ValueError(f"expected {n_groups} values for {name} (one per param group), got {len(value)}")
        return [float(v) for v in value]
    return [float(value)] * n_groups


def _warmup_gamma(it: int, num_steps: int, warmup_type: str) -> float:
    """Fraction of the warm-up done at iteration ``it``: ln(it+1)/ln(N) (log) or it/N (linear); 1 after."""
    it = max(it, 0)
    if it >= num_steps:
        return 1.0
    if warmup_type == "log":
        return math.log(it + 1) / math.log(num_steps)
    return it / num_steps


def _check_warmup_type(warmup_type: str) -> str:
    if warmup_type not in WARMUP_TYPES:
        # DeepSpeed warns and falls back to log; a config that loads there must load here.
        warnings.warn(
            f"unknown warmup_type {warmup_type!r} (known: {', '.join(WARMUP_TYPES)}); using 'log'",
            stacklevel=3,
        )
        return "log"
    return warmup_type


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


class _Schedule:
    """Shared stepping, state and lr writing; subclasses implement ``get_lr()`` for the current iteration."""

    def __init__(self, optimizer: Any, last_batch_iteration: int) -> None:
        self.optimizer = _torch_optimizer(optimizer)
        self.last_batch_iteration = int(last_batch_iteration)
        self._last_lr: list[float] = []

    @classmethod
    def from_config(cls, optimizer: Any, section: SchedulerConfig) -> _Schedule:
        """Build from the ``scheduler`` section; its ``type`` must name this class."""
        if section.type != cls.__name__:
            raise ValueError(f"scheduler.type is {section.type!r}, expected {cls.__name__!r}")
        return cls(optimizer, **section.params)

    def get_lr(self) -> list[float]:
        """The lr of every param group at the current iteration."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The lr last written into the optimizer."""
        return list(self._last_lr)

    def _apply(self) -> None:
        """Write ``get_lr()`` into the groups. A tensor ``lr`` (torch's optimizers accept one) stays that
        tensor, filled in place, as DeepSpeed does; ``get_last_lr()`` then holds the groups' tensors."""
        groups = self.optimizer.param_groups
        for group, lr in zip(groups, self.get_lr()):
            if torch.is_tensor(group["lr"]):
                group["lr"].fill_(lr.squeeze() if torch.is_tensor(lr) else lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in groups]

    def step(self, last_batch_iteration: int | None = None) -> None:
        """Advance one iteration (or jump to ``last_batch_iteration``) and write the new lr.

        Call only after an optimizer step that really happened.
        """
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = int(last_batch_iteration)
        self._apply()

    def state_dict(self) -> dict[str, Any]:
        """``{'last_batch_iteration': i}`` (plain numbers, JSON-safe)."""
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Restore the iteration and write its lr into the optimizer (``sd``: DeepSpeed's parameter name)."""
        self.last_batch_iteration = int(sd["last_batch_iteration"])
        self._apply()


class WarmupLR(_Schedule):
    """Warm the lr up from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps``, then hold it.

    lr(it) = min + (max - min) * gamma, gamma = ln(it+1)/ln(N) (log) or it/N (linear) for it < N, else 1,
    with N = max(2, warmup_num_steps).
    """

    def __init__(
        self,
        optimizer: Any,
        warmup_min_lr: float | Sequence[float] = 0.0,
        warmup_max_lr: float | Sequence[float] = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        super().__init__(optimizer, last_batch_iteration)
        _check_positive_int(warmup_num_steps, "warmup_num_steps")
        self.min_lrs = _per_group(self.optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(self.optimizer, warmup_max_lr, "warmup_max_lr")
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _check_warmup_type(warmup_type)
        self._apply()

    def _gamma(self) -> float:
        return _warmup_gamma(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)

    def get_lr(self) -> list[float]:
        gamma = self._gamma()
        return [lo + (hi - lo) * gamma for lo, hi in zip(self.min_lrs, self.max_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at ``total_num_steps``: gamma = max(0, (T - it) / max(1, T - N))."""

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_lr: float | Sequence[float] = 0.0,
        warmup_max_lr: float | Sequence[float] = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        self.total_num_steps = _check_positive_int(total_num_steps, "total_num_steps")
        super().__init__(
            optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration
        )
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(
                f"total_num_steps {total_num_steps} is less than warmup_num_steps {warmup_num_steps}",
                stacklevel=2,
            )

    def _gamma(self) -> float:
        it = self.last_batch_iteration
        if it < self.warmup_num_steps:
            return super()._gamma()
        return max(0.0, (self.total_num_steps - it) / max(1, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    """Scale each group's original lr: warm-up ratio from ``warmup_min_ratio`` to 1, then a cosine to ``cos_min_ratio``.

    Past ``total_num_steps`` the ratio stays at ``cos_min_ratio`` (DeepSpeed 0.14's cosine rose again there),
    and ``total_num_steps == warmup_num_steps`` does not divide by zero. The original lrs are part of the state,
    so a resumed run does not take the already-scaled lr for the original.
    """

    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = _check_positive_int(total_num_steps, "total_num_steps")
        _check_positive_int(warmup_num_steps, "warmup_num_steps")
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_min_ratio = float(warmup_min_ratio)
        self.cos_min_ratio = float(cos_min_ratio)
        self.warmup_type = _check_warmup_type(warmup_type)
        if self.total_num_steps < self.warmup_num_steps:
            warnings.warn(
                f"total_num_steps {total_num_steps} is less than warmup_num_steps {warmup_num_steps}",
                stacklevel=2,
            )
        # a tensor lr stays a tensor (a copy: the group's own is overwritten at every step)
        self.org_lrs = [
            g["lr"].clone() if torch.is_tensor(g["lr"]) else float(g["lr"])
            for g in self.optimizer.param_groups
        ]
        self._apply()

    def get_lr_ratio(self) -> float:
        """The factor applied to every group's original lr at the current iteration."""
        it = self.last_batch_iteration
        if it < self.warmup_num_steps:
            gamma = _warmup_gamma(it, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * gamma
        progress = min(
            1.0, (it - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps)
        )
        cosine = (1.0 + math.cos(math.pi * progress)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> list[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_batch_iteration": self.last_batch_iteration,
            "org_lrs": [float(v) for v in self.org_lrs],
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if "org_lrs" in sd:  # DeepSpeed's own state holds only the iteration
            self.org_lrs = [
                torch.full_like(old, float(v)) if torch.is_tensor(old) else float(v)
                for old, v in zip(self.org_lrs, sd["org_lrs"], strict=True)
            ]
        super().load_state_dict(sd)


class OneCycle(_Schedule):
    """1-cycle policy: lr up from ``cycle_min_lr`` to ``cycle_max_lr`` and back, then an optional decay.

    Momentum (``betas[0]``) cycles the opposite way between ``cycle_max_mom`` and ``cycle_min_mom`` with
    ``betas[1]`` held at 0.99, as DeepSpeed does. Stair counts > 0 hold lr and momentum flat in that many
    stairs per half cycle (DeepSpeed 0.14 stored them without effect).
    """

    def __init__(
        self,
        optimizer: Any,
        cycle_min_lr: float,
        cycle_max_lr: float,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: int = 2000,
        cycle_second_step_size: int | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: int = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float = 0.8,
        cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ) -> None:
        super().__init__(optimizer, last_batch_iteration)
        first = _check_positive_int(cycle_first_step_size, "cycle_first_step_size")
        second = first if cycle_second_step_size is None else int(cycle_second_step_size)
        if second < 0:
            raise ValueError(f"cycle_second_step_size must be non-negative, got {cycle_second_step_size}")
        if decay_step_size < 0:
            raise ValueError(f"decay_step_size must be non-negative, got {decay_step_size}")
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = int(cycle_first_stair_count)
        self.second_stair_count = (
            self.first_stair_count if cycle_second_stair_count is None else int(cycle_second_stair_count)
        )
        if self.first_stair_count < 0 or self.second_stair_count < 0:
            raise ValueError("cycle_first_stair_count and cycle_second_stair_count must be non-negative")
        self.decay_step_size = int(decay_step_size)
        self.min_lrs = _per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = float(decay_lr_rate)
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum and "betas" not in getattr(self.optimizer, "defaults", {}):
            warnings.warn(
                f"{type(self.optimizer).__name__} has no 'betas': OneCycle momentum cycling is disabled",
                stacklevel=2,
            )
            self.cycle_momentum = False
        self.min_moms = _per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")
        self.decay_mom_rate = float(decay_mom_rate)
        self._apply()
        if self.cycle_momentum and self.last_batch_iteration == -1:
            # DeepSpeed starts every group at its minimum momentum (what the first optimizer step uses); the
            # cycle's own value takes over from the first step()
            for group, lo in zip(self.optimizer.param_groups, self.min_moms):
                group["betas"] = (lo, 0.99)

    def _scale_factor(self) -> float:
        """Position in the cycle: 0 at min lr, 1 at max lr; stairs floor it to k/stairs."""
        b = self.last_batch_iteration + 1
        x = 1.0 + b / self.total_size
        x -= math.floor(x)
        if x <= self.step_ratio:
            factor, stairs = x / self.step_ratio, self.first_stair_count
        else:
            factor, stairs = (x - 1.0) / (self.step_ratio - 1.0), self.second_stair_count
        if stairs > 0:
            # The tolerance keeps round-off just below a stair from dropping a whole stair.
            factor = math.floor(factor * stairs + 1e-9) / stairs
        return factor

    def _decay_interval(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < self.total_size:
            factor = self._scale_factor()
            return [lo + (hi - lo) * factor for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.decay_step_size == 0:
            return list(self.min_lrs)
        return [lo / (1.0 + self.decay_lr_rate * self._decay_interval()) for lo in self.min_lrs]

    def get_mom(self) -> list[tuple[float, float]]:
        """``betas`` of every param group at the current iteration."""
        if self.last_batch_iteration < self.total_size:
            factor = self._scale_factor()
            return [(hi - (hi - lo) * factor, 0.99) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.decay_step_size == 0:
            return [(hi, 0.99) for hi in self.max_moms]
        return [(hi * (1.0 + self.decay_mom_rate * self._decay_interval()), 0.99) for hi in self.max_moms]

    def _apply(self) -> None:
        super()._apply()
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = betas

    def step(self, batch_iteration: int | None = None) -> None:
        """Advance one iteration (or jump to ``batch_iteration``: DeepSpeed's parameter name here)."""
        super().step(batch_iteration)


class LRRangeTest(_Schedule):
    """LR range test: lr = min_lr * (1 + rate * f), f = (it+1)/step_size, floored when ``staircase``."""

    def __init__(
        self,
        optimizer: Any,
        lr_range_test_min_lr: float | Sequence[float] = 1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ) -> None:
        super().__init__(optimizer, last_batch_iteration)
        self.min_lrs = _per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = _check_positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_rate = float(lr_range_test_step_rate)
        self.staircase = bool(lr_range_test_staircase)
        self._apply()

    def get_lr(self) -> list[float]:
        interval = (self.last_batch_iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lo * (1.0 + self.step_rate * interval) for lo in self.min_lrs]

    def step(self, batch_iteration: int | None = None) -> None:
        """Advance one iteration (or jump to ``batch_iteration``: DeepSpeed's parameter name here)."""
        super().step(batch_iteration)

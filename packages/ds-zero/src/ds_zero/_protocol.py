"""The loss-scaler interface ZeRO needs; ds_precision's scalers satisfy it without importing ds_zero."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["LossScalerProtocol"]


@runtime_checkable
class LossScalerProtocol(Protocol):
    """What ``ZeroOptimizer`` asks of a loss scaler.

    ``loss_scale`` multiplies the loss before backward; ``update_scale(overflow)`` is called once per
    optimizer step at a gradient-accumulation boundary, after the ranks agreed on ``overflow``.
    """

    @property
    def loss_scale(self) -> float: ...

    def update_scale(self, overflow: bool) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

"""Interfaces: the loss scaler ZeRO needs (ds_precision's scalers satisfy it without importing ds_zero), and
what the memory report and the sharded state read of a stage 1/2 optimizer (so that ``_memory`` and
``_state`` need not import ``_zero``, which imports them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ._comm import ProcessGroup
    from ._options import ZeroOptions
    from ._partition import FlatGroup

__all__ = ["FlatShardedOptimizer", "LossScalerProtocol"]


@runtime_checkable
class LossScalerProtocol(Protocol):
    """What ``ZeroOptimizer`` asks of a loss scaler.

    ``loss_scale`` multiplies the loss before backward; ``update_scale(overflow)`` is called once per
    optimizer step at a gradient-accumulation boundary, after the ranks agreed on ``overflow``.
    ``loss_scale_config`` (ds_config's snapshot, DeepSpeed's names) is read only when code asks the optimizer
    for it; a scaler without it answers AttributeError there.
    """

    @property
    def loss_scale(self) -> float: ...

    def update_scale(self, overflow: bool) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class FlatShardedOptimizer(Protocol):
    """What ``_memory.memory_report`` and ``_state`` read of ``ZeroOptimizer`` (stages 1 and 2)."""

    groups: list[FlatGroup]
    optimizer: torch.optim.Optimizer
    options: ZeroOptions
    stage: int
    dp: int
    rank: int
    process_group: ProcessGroup | None

    def staging_buffers(self) -> list[torch.Tensor]: ...

    def step_state(self) -> dict: ...

    def load_step_state(self, extra: dict) -> None: ...

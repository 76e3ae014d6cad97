"""What a ZeRO rank holds, by kind, counted from the tensors themselves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ._protocol import FlatShardedOptimizer

__all__ = ["MemoryReport", "memory_report"]


@dataclass(frozen=True)
class MemoryReport:
    """Bytes this rank holds, by kind. Storage shared between kinds is counted once, under the first."""

    param_bytes: int  # the full low-precision model (flat buffers): every rank holds it at stages 1/2
    master_param_bytes: int  # fp32 master partition (0 when it is a view of fp32 weights)
    grad_bytes: int  # gradient buffers held for reduction and the step
    optimizer_state_bytes: int  # inner optimizer state (this rank's partition only)
    offloaded_bytes: int  # the part of the above that lives in CPU memory because of offload

    @property
    def total_bytes(self) -> int:
        """Sum of parameters, master copy, gradients and optimizer state."""
        return self.param_bytes + self.master_param_bytes + self.grad_bytes + self.optimizer_state_bytes


def memory_report(zero: FlatShardedOptimizer) -> MemoryReport:
    """Count the bytes of ``zero``'s buffers; a tensor sharing storage with one already counted adds 0."""
    seen: set[int] = set()

    def nbytes(tensors) -> int:
        total = 0
        for t in tensors:
            if t is None:
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                total += t.untyped_storage().nbytes()
        return total

    groups = zero.groups
    params = nbytes(g.flat for g in groups)
    master = nbytes(g.master for g in groups)
    grads = nbytes(
        [g.grad_part for g in groups] + [g.flat_grad for g in groups] + list(zero.staging_buffers())
    )
    grads += nbytes(p.grad for g in groups for p in g.params)
    grads += nbytes(g.master.grad for g in groups)
    state = nbytes(v for s in zero.optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    offloaded = master + state if zero.options.cpu_offload else 0
    return MemoryReport(params, master, grads, state, offloaded)

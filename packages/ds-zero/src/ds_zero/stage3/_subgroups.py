"""``sub_group_size``: the inner optimizer steps each fp32 partition a sub-group at a time.

Each group's fp32 master partition is cut into views of at most ``sub_group_size`` elements; the inner
optimizer's param group holds those views. A step gives one sub-group at a time its fp32 gradient and
calls the inner optimizer (the others have no gradient, so it skips them): the fp32 gradient copy and the
optimizer's temporaries never exceed one sub-group. Optimizer state is kept per view; ``state_of`` and
``load_state`` show it as one tensor per group (the checkpoint format does not depend on the cut).

For an element-wise optimizer (ZeRO's tested ones, or one marked ``ds_zero_elementwise``) the views are
at most ``STEP_PIECE`` elements whatever ``sub_group_size`` says: torch's optimizers allocate
temporaries the size of the tensor they update (AdamW's ``exp_avg_sq.sqrt() / c`` is two of them), so
one view of a whole partition made the step's peak two partitions above the steady state. Cutting
changes nothing an element-wise update computes; for any other optimizer the cut is ``sub_group_size``'s
alone (its per-tensor quantities, e.g. LAMB's trust ratio, are per sub-group, as in DeepSpeed).
"""

from __future__ import annotations

import torch

from .._fragments import state_piece
from .._options import TESTED_OPTIMIZERS

__all__ = ["STEP_PIECE", "ScaledGrad", "SubGroups", "view_size"]

STEP_PIECE = 1 << 22  # elements per view of an element-wise optimizer (16 MiB in fp32)


def view_size(optimizer: torch.optim.Optimizer, sub_group_size: int) -> int:
    """Elements per view the inner optimizer updates: ``sub_group_size``, capped when element-wise."""
    elementwise = type(optimizer).__name__ in TESTED_OPTIMIZERS or getattr(
        optimizer, "ds_zero_elementwise", False
    )
    return min(sub_group_size, STEP_PIECE) if elementwise else sub_group_size


class ScaledGrad:
    """A view's gradient as the inner optimizer takes it: ``grad * inv_scale`` in fp32, made in one fp32
    buffer reused from view to view. ``grad.to(torch.float32)`` would allocate a view-sized tensor per view,
    and on the CPU a block that size is often a fresh ``mmap`` whose page faults cost more than the cast
    (always with the NVMe step's fixed mmap threshold, ``_heap``). An fp32 gradient on the view's device is
    scaled where it is, as before (it is not used again). One per step: the buffer goes with it."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def __call__(self, grad: torch.Tensor, inv_scale: float, device: torch.device) -> torch.Tensor:
        if grad.dtype == torch.float32 and grad.device == device:
            return grad.mul_(inv_scale)
        n = grad.numel()
        if self._buf is None or self._buf.numel() < n or self._buf.device != device:
            self._buf = torch.empty(n, dtype=torch.float32, device=device)
        out = self._buf[:n].view(grad.shape)
        out.copy_(grad)
        return out.mul_(inv_scale)


class SubGroups:
    """The views of every group's master partition that the inner optimizer steps one at a time."""

    def __init__(self, masters: list[torch.Tensor], sub_group_size: int) -> None:
        if sub_group_size < 1:
            raise ValueError(f"sub_group_size must be >= 1, got {sub_group_size}")
        self.views: list[list[torch.Tensor]] = []
        for master in masters:
            base = master.detach()  # shares storage: the views' updates are the master's
            bounds = range(0, max(master.numel(), 1), sub_group_size)
            views = [base[lo : lo + sub_group_size].requires_grad_(True) for lo in bounds]
            self.views.append(views)

    def step(
        self, optimizer: torch.optim.Optimizer, grad_parts: list[torch.Tensor], inv_scale: float
    ) -> None:
        """One optimizer step over every sub-group: ``grad * inv_scale`` in fp32, a sub-group at a time."""
        scaled = ScaledGrad()
        for views, grad in zip(self.views, grad_parts):
            offset = 0
            for view in views:
                view.grad = scaled(grad[offset : offset + view.numel()], inv_scale, view.device)
                optimizer.step()
                view.grad = None  # the next call skips this sub-group
                offset += view.numel()

    def state_of(self, optimizer: torch.optim.Optimizer, g: int) -> dict[str, object]:
        """Group ``g``'s optimizer state as whole-partition tensors (element-wise state concatenated)."""
        views = self.views[g]
        states = [optimizer.state.get(v, {}) for v in views]
        out: dict[str, object] = {}
        for key, value in states[0].items():
            if torch.is_tensor(value) and value.dim() == 1 and value.numel() == views[0].numel():
                out[key] = torch.cat([s[key] for s in states]) if len(views) > 1 else value
            else:
                out[key] = value  # scalars (Adam's step) are equal in every sub-group
        return out

    def state_range(
        self, optimizer: torch.optim.Optimizer, g: int, key: str, lo: int, hi: int
    ) -> list[tuple[torch.Tensor, int, int]]:
        """Elements ``[lo, hi)`` of group ``g``'s element-wise state ``key`` as ``(piece, a, b)``: ``piece``
        is a view of one sub-group's state tensor holding elements ``[a, b)`` of the partition."""
        # the key is checked on every rank, holding a piece or not: a rank that raised alone would leave the
        # others waiting in the collective of a full read
        state_piece(optimizer.state.get(self.views[g][0], {}), key, 0, 0, "the ZeRO-3 optimizer")
        out, offset = [], 0
        for view in self.views[g]:
            a, b = max(lo, offset), min(hi, offset + view.numel())
            if a < b:
                state = optimizer.state.get(view, {})
                out.append((state_piece(state, key, a - offset, b - offset, "the ZeRO-3 optimizer"), a, b))
            offset += view.numel()
        return out

    def load_state(self, optimizer: torch.optim.Optimizer, g: int, state: dict[str, object]) -> None:
        """Set group ``g``'s state from whole-partition tensors (each view gets its slice)."""
        offset = 0
        for view in self.views[g]:
            n = view.numel()
            optimizer.state[view] = {
                # scalar tensors cloned too: Adam increments its step tensor in place, once per view
                k: (v[offset : offset + n] if v.dim() == 1 else v).clone() if torch.is_tensor(v) else v
                for k, v in state.items()
            }
            offset += n

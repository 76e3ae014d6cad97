"""The parts of a ZeRO step: loss scale and overflow skipping, global norm, clipping, weight gather.

``LossScaledStep`` is the bookkeeping ZeRO 1/2 (``_zero``) and ZeRO 3 (``stage3/_optimizer``) share
around their own norm and update: scale the loss, skip the step on overflow, unscale and clip in one
divisor, tell the scaler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ._comm import ProcessGroup, all_gather_views, global_rank
from ._partition import FlatGroup
from ._protocol import LossScalerProtocol

__all__ = ["LossScaledStep", "gather_partitions", "global_norm_sq", "unscale_factor"]


class LossScaledStep:
    """Base of the ZeRO optimizers: what a step does around the norm and the update, the same at every stage.

    Subclasses set ``scaler``, ``clip_grad``, ``skipped_steps`` and ``global_grad_norm`` and define
    ``zero_grad``. A step is ``divisor = self._begin_step(norm_sq)``; None means skipped for overflow
    (already counted and cleared); else divide the gradients by ``divisor``, update, ``_end_step()``.
    """

    scaler: LossScalerProtocol | None
    clip_grad: float
    skipped_steps: int
    global_grad_norm: float | None

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without a scaler)."""
        return float(self.scaler.loss_scale) if self.scaler is not None else 1.0

    def zero_grad(self, set_to_none: bool = True) -> None:
        raise NotImplementedError

    def _scaled_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * loss_scale`` in fp32 (the loss itself without a scaler)."""
        return loss.float() * self.loss_scale if self.scaler is not None else loss

    def _begin_step(self, norm_sq: float) -> float | None:
        """The divisor that unscales and clips, from the squared norm of the scaled gradients.

        On overflow (``norm_sq`` not finite) the step is skipped: the scaler lowers its scale, the skip
        is counted, the gradients are cleared, and None is returned.
        """
        if not math.isfinite(norm_sq):
            if self.scaler is not None:
                self.scaler.update_scale(True)
            self.skipped_steps += 1
            self.global_grad_norm = None
            self.zero_grad()
            return None
        scale = self.loss_scale
        scaled_norm = math.sqrt(norm_sq)
        self.global_grad_norm = scaled_norm / scale
        return unscale_factor(scaled_norm, scale, self.clip_grad)

    def _end_step(self) -> None:
        """After an applied update: the scaler counts an overflow-free step; gradients are cleared."""
        if self.scaler is not None:
            self.scaler.update_scale(False)
        self.zero_grad()


def global_norm_sq(
    groups: Sequence[FlatGroup], group: ProcessGroup | None, mp_group: ProcessGroup | None
) -> float:
    """Squared L2 norm of every rank's partition gradient; ``inf`` when any rank saw inf or nan.

    The ranks agree on overflow with the same all-reduce SUM that adds the squares: each rank adds a 0/1
    overflow flag, and a sum of 0/1 flags is nonzero exactly when one of them is (what an all-reduce MAX
    would say), so one collective carries both numbers.
    """
    local = torch.zeros(2, dtype=torch.float64)
    for g in groups:
        if g.grad_part is None:  # no reduction this window: a zero gradient
            continue
        ranges = g.norm_ranges if g.norm_ranges is not None else [(0, g.grad_part.numel())]
        zero = torch.zeros((), dtype=torch.float64, device=g.grad_part.device)
        local[0] += sum((g.grad_part[lo:hi].double().pow(2).sum() for lo, hi in ranges), zero).cpu()
        # every element counts for overflow, replicated across model-parallel ranks or not
        local[1] = max(float(local[1]), float((~torch.isfinite(g.grad_part)).any()))
    device = groups[0].flat.device if groups else torch.device("cpu")
    both = local.to(device)
    dist.all_reduce(both, group=group)
    if mp_group is not None:
        dist.all_reduce(both, group=mp_group)
    if both[1] > 0 or not math.isfinite(float(both[0])):
        return math.inf
    return float(both[0])


def unscale_factor(scaled_norm: float, loss_scale: float, clip_grad: float) -> float:
    """The one divisor that unscales and clips: ``max(clip, 1) * scale`` with DeepSpeed's ``clip`` formula."""
    if clip_grad <= 0:
        return loss_scale
    clip = ((scaled_norm / loss_scale) + 1e-6) / clip_grad
    return max(clip, 1.0) * loss_scale


def gather_partitions(
    g: FlatGroup, group: ProcessGroup | None, bucket_elems: int, use_all_gather: bool
) -> None:
    """Give every rank the updated partitions of all owners, ``bucket_elems`` elements at a time.

    ``use_all_gather`` false (``allgather_partitions: false``) sends each owner's part with its own
    broadcast instead.
    """
    dp, rank = g.layout.dp, g.rank
    part = g.layout.partition_numel
    chunk = max(1, bucket_elems // dp)
    for k0 in range(0, part, chunk):
        k1 = min(part, k0 + chunk)
        views = [g.flat[r * part + k0 : r * part + k1] for r in range(dp)]
        if use_all_gather:
            all_gather_views(views, rank, group)
        else:
            works = [
                dist.broadcast(views[r], src=global_rank(group, r), group=group, async_op=True)
                for r in range(dp)
            ]
            for w in works:
                w.wait()

"""The parts of a ZeRO step: loss scale and overflow skipping, global norm, clipping, weight gather.

``LossScaledStep`` is the bookkeeping ZeRO 1/2 (``_zero``) and ZeRO 3 (``stage3/_optimizer``) share
around their own norm and update: scale the loss, skip the step on overflow, unscale and clip in one
divisor, tell the scaler, and save and restore that bookkeeping with a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from ds_config import LossScaleConfig

from ._comm import ProcessGroup, all_gather_views
from ._partition import FlatGroup
from ._protocol import LossScalerProtocol

__all__ = [
    "LossScaledStep",
    "gather_partitions",
    "global_norm_sq",
    "norm_of",
    "partition_norm_sq",
    "unscale_factor",
]


class LossScaledStep:
    """Base of the ZeRO optimizers: what a step does around the norm and the update, the same at every stage.

    Subclasses set ``scaler``, ``clip_grad``, ``skipped_steps`` and ``global_grad_norm`` and define
    ``zero_grad``. A step is ``divisor = self._begin_step(norm_sq)``; None means skipped for overflow
    (already counted and cleared); else divide the gradients by ``divisor``, update, ``_end_step()``.
    """

    optimizer: torch.optim.Optimizer
    scaler: LossScalerProtocol | None
    clip_grad: float
    skipped_steps: int
    global_grad_norm: float | None
    # DeepSpeed 0.19.8's stage 3 divides the norm it reports by the scale after the step's update, its stages
    # 1 and 2 by the scale before it (they differ on a step that grows the scale)
    norm_after_scale_update = False

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without a scaler)."""
        return float(self.scaler.loss_scale) if self.scaler is not None else 1.0

    @property
    def param_groups(self) -> list[dict]:
        """The inner optimizer's param groups (for LR schedulers); they hold this rank's fp32 partitions."""
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        """The inner optimizer's per-parameter state, as a torch optimizer exposes it: keyed by the parameters in
        ``param_groups`` (views of this rank's fp32 partition), each value that view's state (Adam's ``exp_avg``,
        ``exp_avg_sq``, ``step``). DeepSpeed's ZeRO optimizers expose the same (Lightning reads it at teardown)."""
        return self.optimizer.state

    def step_state(self) -> dict:
        """The step's bookkeeping for a checkpoint's ``meta["extra"]`` (the loss scaler's state included)."""
        return {
            "clip_grad": self.clip_grad,
            "skipped_steps": self.skipped_steps,
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load_step_state(self, extra: dict) -> None:
        """Restore what ``step_state`` saved: the loss scaler's state (scale, counters), when both have one."""
        if self.scaler is not None and extra.get("loss_scaler") is not None:
            self.scaler.load_state_dict(extra["loss_scaler"])

    @property
    def loss_scaler(self) -> LossScalerProtocol | None:
        """The loss scaler itself (None without fp16), under DeepSpeed's name for it."""
        return self.scaler

    @property
    def cur_scale(self) -> float:
        """The current loss scale, as DeepSpeed's ZeRO optimizers name it (1.0 without a scaler)."""
        return self.loss_scale

    @cur_scale.setter
    def cur_scale(self, value: float) -> None:
        if self.scaler is None:
            raise AttributeError("cur_scale can be set only with fp16 enabled (there is no loss scaler)")
        self.scaler.cur_scale = float(value)

    @property
    def dynamic_loss_scale(self) -> bool:
        """True when the loss scale moves (fp16 with ``loss_scale: 0``), as DeepSpeed's attribute says."""
        return bool(getattr(self.scaler, "dynamic", False))

    @property
    def loss_scale_config(self) -> LossScaleConfig:
        """The scaler's settings and state under DeepSpeed's names: the scaler's own snapshot (fresh per access),
        or no scaling without a scaler (fp32, bf16)."""
        return self.scaler.loss_scale_config if self.scaler is not None else LossScaleConfig.unscaled()

    def zero_grad(self, set_to_none: bool = True) -> None:
        raise NotImplementedError

    def _scaled_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * loss_scale`` in fp32 (the loss itself without a scaler)."""
        return loss.float() * self.loss_scale if self.scaler is not None else loss

    def _begin_step(self, norm_sq: float) -> float | None:
        """The divisor that unscales and clips, from the squared norm of the scaled gradients.

        On overflow (``norm_sq`` not finite) the step is skipped: the scaler lowers its scale, the skip
        is counted, the gradients are cleared, and None is returned. Otherwise the scaler counts an
        overflow-free step first, and the divisor is made with the scale it then holds: as in DeepSpeed
        0.19.8's ZeRO optimizers, a step that grows the scale divides its gradients by the grown scale.
        """
        if not math.isfinite(norm_sq):
            if self.scaler is not None:
                self.scaler.update_scale(True)
            self.skipped_steps += 1
            self.global_grad_norm = None
            self.zero_grad()
            return None
        before = self.loss_scale
        if self.scaler is not None:
            self.scaler.update_scale(False)
        scale = self.loss_scale
        scaled_norm = math.sqrt(norm_sq)
        self.global_grad_norm = scaled_norm / (scale if self.norm_after_scale_update else before)
        return unscale_factor(scaled_norm, scale, self.clip_grad)

    def _end_step(self) -> None:
        """After an applied update: gradients are cleared (the scaler counted the step in ``_begin_step``)."""
        self.zero_grad()


NORM_CHUNK = 1 << 20  # elements per piece of the norm: a cast of one piece is the largest temporary


def global_norm_sq(
    groups: Sequence[FlatGroup], group: ProcessGroup | None, mp_group: ProcessGroup | None
) -> float:
    """Squared L2 norm of every rank's partition gradient (stages 1 and 2); ``inf`` when any rank saw inf/nan."""
    parts = [(g.grad_part, g.norm_ranges) for g in groups if g.grad_part is not None]  # None: no reduction
    device = groups[0].flat.device if groups else torch.device("cpu")
    return partition_norm_sq(parts, device, group, mp_group)


def partition_norm_sq(
    parts: Sequence[tuple[torch.Tensor, Sequence[tuple[int, int]] | None]],
    device: torch.device,
    group: ProcessGroup | None,
    mp_group: ProcessGroup | None,
) -> float:
    """Squared global L2 norm of the ``(gradient, counted ranges)`` partitions of every rank; ``inf`` on overflow.

    ``ranges`` None counts the whole tensor; elements outside the ranges (model-parallel replicas) do
    not count towards the norm, but an inf/nan there still skips the step. The ranks agree on both in one
    all-reduce SUM: the sum of squares is taken per piece in fp32 (``vector_norm``, no float64 copy),
    and an inf/nan anywhere makes it non-finite (``0 * inf`` is nan for the uncounted elements). Only
    when the sum is non-finite do a second all-reduce (MAX of an inf/nan flag) and, if no element was
    inf/nan (finite gradients whose fp32 squares overflowed), an exact float64 pass decide.

    A gradient may also be a file (stage 3's ``GradFile`` with NVMe offload, anything with
    ``piece_norms(ranges, dtype, chunk)`` and ``all_finite(chunk)``): the same pieces, read one at a time.
    """
    sq = _sum_sq(parts, torch.float32, device)
    _all_reduce(sq, dist.ReduceOp.SUM, group, mp_group)
    total = float(sq)
    if math.isfinite(total):
        return total
    flag = torch.tensor(
        [float(any(not _all_finite(t) for t, _ in parts))], dtype=torch.float64, device=device
    )
    _all_reduce(flag, dist.ReduceOp.MAX, group, mp_group)
    if flag.item():
        return math.inf
    sq = _sum_sq(parts, torch.float64, device)
    _all_reduce(sq, dist.ReduceOp.SUM, group, mp_group)
    return float(sq)


def _sum_sq(
    parts: Sequence[tuple[torch.Tensor, Sequence[tuple[int, int]] | None]], dtype: torch.dtype, device
) -> torch.Tensor:
    """float64 sum of squares of the counted ranges (plus ``0 *`` that of the uncounted elements)."""
    counted: list[torch.Tensor] = []
    rest: list[torch.Tensor] = []
    scratch: dict[torch.dtype, torch.Tensor] = {}
    for t, ranges in parts:
        flat = t.reshape(-1) if isinstance(t, torch.Tensor) else t
        counted += _piece_norms(flat, ranges if ranges is not None else [(0, flat.numel())], dtype, scratch)
        if ranges is not None:  # the replicas' overflow rides along at the cost of one read
            rest += _piece_norms(flat, [(0, flat.numel())], dtype, scratch)
    sq = torch.zeros((), dtype=torch.float64, device=device)
    if counted:
        sq += torch.stack(counted).to(device, torch.float64).square().sum()
    if rest:
        sq += 0.0 * torch.stack(rest).to(device, torch.float64).square().sum()
    return sq


def _piece_norms(
    flat, ranges: Sequence[tuple[int, int]], dtype: torch.dtype, scratch: dict[torch.dtype, torch.Tensor]
) -> list[torch.Tensor]:
    if not isinstance(
        flat, torch.Tensor
    ):  # a gradient in a file (stage 3's ``GradFile``): read piece by piece
        return flat.piece_norms(ranges, dtype, NORM_CHUNK)
    return [
        norm_of(flat[c : min(hi, c + NORM_CHUNK)], dtype, scratch)
        for lo, hi in ranges
        for c in range(lo, hi, NORM_CHUNK)
    ]


def norm_of(
    piece: torch.Tensor, dtype: torch.dtype, scratch: dict[torch.dtype, torch.Tensor]
) -> torch.Tensor:
    """``vector_norm(piece, dtype=dtype)`` bit for bit, the cast made into a buffer of ``scratch`` reused
    from one piece to the next. ``vector_norm``'s own cast allocates a piece-sized tensor per call; on the
    CPU a block that size is often a fresh ``mmap`` (always with the NVMe step's fixed threshold, see
    ``stage3/_heap``), and its page faults cost more than the norm itself (docs/benchmarks.md, "The final
    main at 1.064B")."""
    if piece.dtype == dtype:
        return torch.linalg.vector_norm(piece)
    buf = scratch.get(dtype)
    n = piece.numel()
    if buf is None or buf.numel() < n or buf.device != piece.device:
        buf = scratch[dtype] = torch.empty(max(n, NORM_CHUNK), dtype=dtype, device=piece.device)
    cast = buf[:n]
    cast.copy_(piece.reshape(-1))
    return torch.linalg.vector_norm(cast)


def _all_finite(t) -> bool:
    return bool(torch.isfinite(t).all()) if isinstance(t, torch.Tensor) else t.all_finite(NORM_CHUNK)


def _all_reduce(t: torch.Tensor, op, group: ProcessGroup | None, mp_group: ProcessGroup | None) -> None:
    dist.all_reduce(t, op=op, group=group)
    if mp_group is not None:
        dist.all_reduce(t, op=op, group=mp_group)


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
    if dp == 1:  # this rank's partition is the whole group: nothing to gather
        return
    part = g.layout.partition_numel
    chunk = max(1, bucket_elems // dp)
    for k0 in range(0, part, chunk):
        k1 = min(part, k0 + chunk)
        views = [g.flat[r * part + k0 : r * part + k1] for r in range(dp)]
        # allgather_partitions false: a broadcast from each owner, whatever the backend's fastest gather
        all_gather_views(views, rank, group, None if use_all_gather else "broadcast")

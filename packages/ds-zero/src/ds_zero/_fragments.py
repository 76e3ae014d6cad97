"""One parameter's fp32 master, optimizer state and reduced gradient, read and written through the flat layout.

These are what DeepSpeed's ``safe_get_full_*`` / ``safe_set_full_*`` (and, at stage 3, the ``*_local_*``
variants) reach. A parameter occupies ``[start, end)`` of its group's flat space; each rank holds the
piece of it that falls in its partition (possibly none). A *full* read has every rank copy its piece into
a zero tensor of the parameter's size and sums them with one all-reduce, so it is collective and gives
the same fp32 tensor everywhere. A *full* write takes the whole value on every rank; each rank keeps its
piece. *Local* reads and writes touch this rank's piece only (flat, ``local_numel`` elements).

The stage 1/2 and stage 3 optimizers say where a group's partitions live (``_span``, ``_read_piece``,
``_write_piece``); everything else is here, once. ``optimizer_of(param)`` finds the optimizer that owns
a parameter through a weak reference set when the optimizer was built.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from ._comm import ProcessGroup
from ._errors import OptimizerStateKeyError
from ._layout import GroupLayout

__all__ = ["Fragment", "ParamFragments", "ParamSpan", "attach_owner", "optimizer_of", "state_piece"]

# what a read or write touches: the fp32 master weights, the reduced gradient, or an optimizer state tensor
Fragment = Literal["fp32", "grad", "state"]

_OWNER_ATTR = "ds_zero_optimizer"  # a weakref.ref to the ZeRO optimizer that trains the parameter


@dataclass(frozen=True)
class ParamSpan:
    """Where one parameter lies in its group's flat space, seen from rank ``rank``."""

    group: int
    layout: GroupLayout
    rank: int
    start: int
    end: int
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.end - self.start

    def local(self) -> tuple[int, int]:
        """``[lo, hi)`` of this rank's piece of the parameter in its partition (``lo == hi``: no piece)."""
        ps, pe = self.layout.partition_range(self.rank)
        lo, hi = max(self.start, ps), min(self.end, pe)
        return (lo - ps, hi - ps) if lo < hi else (0, 0)

    def local_in_param(self) -> tuple[int, int]:
        """The same piece in the parameter's own flat coordinates ``[0, numel)``."""
        lo, hi = self.local()
        offset = self.layout.partition_range(self.rank)[0] - self.start
        return (lo + offset, hi + offset) if lo < hi else (0, 0)


class ParamFragments:
    """Per-parameter access to a flat-partitioned optimizer (the base of the stage 1/2 and stage 3 ones).

    Subclasses define ``_span``, ``_device``, ``_read_piece`` and ``_write_piece``; ``_after_full_write``
    lets them keep the weights the model uses consistent when the master is those weights.
    Every ``full_*`` call is collective over ``process_group`` (``_span_group``'s for a parameter partitioned
    over another group): each rank calls it for the same parameter.
    """

    process_group: ProcessGroup | None

    # ------------------------------------------------------------------ what a stage provides
    def _span(self, param: nn.Parameter) -> ParamSpan:
        raise NotImplementedError

    def _device(self, span: ParamSpan) -> torch.device:
        """Where the parameter computes: its full values are assembled (and all-reduced) there."""
        raise NotImplementedError

    def _read_piece(self, span: ParamSpan, what: Fragment, key: str | None) -> torch.Tensor | None:
        """This rank's piece (``span.local()`` of the partition); None when no gradient exists now."""
        raise NotImplementedError

    def _write_piece(self, span: ParamSpan, what: Fragment, key: str | None, values: torch.Tensor) -> None:
        raise NotImplementedError

    def _after_full_write(self, param: nn.Parameter, span: ParamSpan, value: torch.Tensor) -> None:
        """After ``set_full_fp32_param`` wrote the master pieces (nothing to do by default)."""

    def _span_group(self, span: ParamSpan) -> ProcessGroup | None:
        """The ranks holding the pieces of the parameter (``process_group`` unless its group is partitioned
        over another, an expert group's)."""
        return self.process_group

    def _prepare(self, what: Fragment) -> None:
        """Called on every rank before any rank reads or writes its piece: the place for a collective that
        must precede the access (stage 1 reduces a window's gradients there). Nothing by default."""

    # ------------------------------------------------------------------ full values (collective)
    def full_fp32_param(self, param: nn.Parameter) -> torch.Tensor:
        """The parameter's fp32 master value, whole, in its shape, on every rank."""
        return self._gather(param, "fp32", None)  # type: ignore[return-value]

    def full_optimizer_state(self, param: nn.Parameter, key: str) -> torch.Tensor:
        """The inner optimizer's element-wise state ``key`` (Adam's ``exp_avg``, ``exp_avg_sq``) of the parameter."""
        return self._gather(param, "state", key)  # type: ignore[return-value]

    def full_grad(self, param: nn.Parameter) -> torch.Tensor | None:
        """The parameter's gradient averaged over the ranks (loss-scaled under fp16), in fp32; None when
        no gradient of this accumulation window exists (before the first backward, after the step)."""
        return self._gather(param, "grad", None)

    def set_full_fp32_param(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Overwrite the parameter's fp32 master with ``value`` (its whole value, the same on every rank)."""
        span = self._span(param)
        self._scatter(span, "fp32", None, value)
        self._after_full_write(param, span, value)

    def set_full_optimizer_state(self, param: nn.Parameter, value: torch.Tensor, key: str) -> None:
        """Overwrite the parameter's optimizer state ``key`` with ``value`` (whole, the same on every rank)."""
        self._scatter(self._span(param), "state", key, value)

    def set_full_grad(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Make ``value`` the parameter's reduced gradient for the coming step (whole, the same on every rank)."""
        self._scatter(self._span(param), "grad", None, value)

    # ------------------------------------------------------------------ this rank's piece
    def local_fp32_param(self, param: nn.Parameter) -> torch.Tensor:
        """This rank's piece of the parameter's fp32 master (flat; empty when the rank holds none of it)."""
        return self._local(param, "fp32", None)  # type: ignore[return-value]

    def local_optimizer_state(self, param: nn.Parameter, key: str) -> torch.Tensor:
        """This rank's piece of the parameter's optimizer state ``key`` (flat)."""
        return self._local(param, "state", key)  # type: ignore[return-value]

    def local_grad(self, param: nn.Parameter) -> torch.Tensor | None:
        """This rank's piece of the parameter's reduced gradient in fp32 (flat); None when none exists."""
        return self._local(param, "grad", None)

    def set_local_fp32_param(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Overwrite this rank's piece of the fp32 master (``value`` has ``local_fp32_param``'s size)."""
        self._write_local(param, "fp32", None, value)

    def set_local_optimizer_state(self, param: nn.Parameter, value: torch.Tensor, key: str) -> None:
        """Overwrite this rank's piece of the optimizer state ``key``."""
        self._write_local(param, "state", key, value)

    def set_local_grad(self, param: nn.Parameter, value: torch.Tensor) -> None:
        """Overwrite this rank's piece of the reduced gradient."""
        self._write_local(param, "grad", None, value)

    # ------------------------------------------------------------------ the one implementation
    def _gather(self, param: nn.Parameter, what: Fragment, key: str | None) -> torch.Tensor | None:
        span = self._span(param)
        self._prepare(what)
        piece = self._read_piece(span, what, key)
        if piece is None:  # no gradient: the same on every rank (they reduce the same buckets)
            return None
        full = torch.zeros(span.numel, dtype=torch.float32, device=self._device(span))
        a, b = span.local_in_param()
        full[a:b].copy_(piece)
        group = self._span_group(span)
        if dist.get_world_size(group) > 1:
            dist.all_reduce(full, group=group)  # each element is non-zero on one rank only
        return full.view(span.shape)

    def _scatter(self, span: ParamSpan, what: Fragment, key: str | None, value: torch.Tensor) -> None:
        if value.numel() != span.numel:
            raise ValueError(
                f"the value has {value.numel()} elements ({tuple(value.shape)}) but the parameter has "
                f"{span.numel} ({tuple(span.shape)}): pass the parameter's whole value"
            )
        self._prepare(what)
        a, b = span.local_in_param()
        if a < b:  # a rank holding none of the parameter writes nothing
            self._write_piece(span, what, key, value.detach().reshape(-1)[a:b])

    def _local(self, param: nn.Parameter, what: Fragment, key: str | None) -> torch.Tensor | None:
        span = self._span(param)
        self._prepare(what)
        piece = self._read_piece(span, what, key)
        return None if piece is None else piece.detach().float().clone()

    def _write_local(self, param: nn.Parameter, what: Fragment, key: str | None, value: torch.Tensor) -> None:
        span = self._span(param)
        self._prepare(what)
        lo, hi = span.local()
        if value.numel() != hi - lo:
            raise ValueError(
                f"the value has {value.numel()} elements but this rank (rank {span.rank}) holds {hi - lo} "
                "of the parameter: pass what the local getter returns, changed"
            )
        if lo < hi:
            self._write_piece(span, what, key, value.detach().reshape(-1))


def state_piece(state: dict, key: str, lo: int, hi: int, what: str) -> torch.Tensor:
    """``state[key][lo:hi]``, or an error naming the element-wise keys there are."""
    value = state.get(key)
    if not torch.is_tensor(value) or value.dim() != 1:
        keys = sorted(k for k, v in state.items() if torch.is_tensor(v) and v.dim() == 1)
        when = " (the inner optimizer has no state before its first step)" if not state else ""
        raise OptimizerStateKeyError(
            f"{what} has no element-wise optimizer state {key!r}{when}; it has {keys}"
        )
    return value[lo:hi]


def attach_owner(params: Iterable[nn.Parameter], owner: ParamFragments) -> None:
    """Let ``optimizer_of`` find ``owner`` from each of ``params`` (weakly: the parameter does not keep it alive)."""
    ref = weakref.ref(owner)
    for p in params:
        setattr(p, _OWNER_ATTR, ref)


def optimizer_of(param: nn.Parameter) -> ParamFragments | None:
    """The live ZeRO optimizer (stage 1, 2 or 3) that trains ``param``, or None."""
    ref = getattr(param, _OWNER_ATTR, None)
    return ref() if ref is not None else None

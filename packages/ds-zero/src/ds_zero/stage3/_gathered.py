"""``GatheredParameters``: make partitioned parameters whole for a block, optionally let one rank modify them."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from .._comm import global_rank, group_size
from ._construct import cut, full_value, is_constructed_partitioned
from ._status import ZeroParamStatus, set_status

__all__ = ["GatheredParameters"]


class GatheredParameters:
    """Inside the block the given parameters are whole on every rank (collective on enter and exit).

    With ``modifier_rank`` set, that rank's values are broadcast on exit and every rank keeps its part
    of them (the fp32 masters included), so a change made on one rank takes effect everywhere. With
    ``modifier_rank=None`` changes are discarded. Parameters that are not partitioned pass through.
    ``fwd_module`` is accepted for DeepSpeed compatibility: external parameters need no registration here.
    """

    def __init__(
        self,
        params: nn.Parameter | Iterable[nn.Parameter],
        modifier_rank: int | None = None,
        fwd_module: nn.Module | None = None,
        enabled: bool = True,
    ) -> None:
        self.params = [params] if torch.is_tensor(params) else list(params)
        self.modifier_rank = modifier_rank
        self.enabled = enabled

    def __enter__(self) -> None:
        if not self.enabled:
            return
        for p in self.params:
            if is_constructed_partitioned(p):
                p.data = full_value(p).clone()
                set_status(p, ZeroParamStatus.AVAILABLE)
        for manager, slots in self._managed():
            for s in slots:
                s.pins += 1  # keeps them whole until __exit__
            manager.gather(slots, exact=True)  # never quantized: a modifier writes them back

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        for p in self.params:
            if is_constructed_partitioned(p):
                group = p.ds_group
                self._broadcast(p.data, group)
                if self.modifier_rank is not None:
                    cut(p, p.data, group)
                else:
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                    set_status(p, ZeroParamStatus.NOT_AVAILABLE)
        for manager, slots in self._managed():
            with torch.no_grad():
                for s in slots:
                    if self.modifier_rank is not None:
                        self._broadcast(s.param.data, manager.process_group)
                        manager.write_back(s, s.param.data)
                    s.pins -= 1
            if self.modifier_rank is None:
                manager.refresh_whole()  # discard changes to whole parameters too
            manager.release(slots)

    def _broadcast(self, t: torch.Tensor, group: object) -> None:
        if self.modifier_rank is not None and group_size(group) > 1:
            dist.broadcast(t, src=global_rank(group, self.modifier_rank), group=group)

    def _managed(self) -> list:
        by_manager: dict[int, tuple] = {}
        for p in self.params:
            manager = getattr(p, "ds_stage3", None)
            if manager is not None:
                by_manager.setdefault(id(manager), (manager, []))[1].append(p)
        return [(m, m.slots_of(ps)) for m, ps in by_manager.values()]

"""Partitioning while a model is built (``zero.Init``): each parameter is cut as its module is constructed.

A module's parameters exist whole only until the outermost ``__init__`` of that module returns; then
each is broadcast from rank 0 (so every rank starts from the same weights, as DeepSpeed does), cut into
``dp`` equal chunks and replaced by an empty tensor. The whole model therefore never exists on a rank.
Inside the context ``nn.Module.apply`` sees the cut parameters whole, as under DeepSpeed's ``zero.Init``: a
parent that initialises its children's weights (``self.apply(self._init_weights)`` in its ``__init__``)
gets them gathered, and rank 0's values are kept (``GatheredParameters(..., modifier_rank=0)``).
The stage-3 optimizer later moves the chunks into its flat partitions (``full_value``, one parameter at a
time).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .._comm import ProcessGroup, global_rank, group_rank, group_size
from ._status import ZeroParamStatus, mark, set_status

__all__ = [
    "PartitionOnConstruction",
    "cut",
    "forget_construction",
    "full_value",
    "is_constructed_partitioned",
    "source_shape",
]


def is_constructed_partitioned(p: torch.Tensor) -> bool:
    """True for a parameter cut by ``PartitionOnConstruction`` and not yet taken over by the optimizer."""
    return hasattr(p, "ds_chunk")


def source_shape(p: torch.Tensor) -> torch.Size:
    """The full shape of a parameter, whole or cut at construction."""
    return p.ds_shape if is_constructed_partitioned(p) else p.shape


def full_value(p: torch.Tensor) -> torch.Tensor:
    """The whole value of ``p``: its data, or its chunks gathered from every rank (collective then)."""
    if not is_constructed_partitioned(p):
        return p.detach()
    group = p.ds_group
    chunks = [torch.empty_like(p.ds_chunk) for _ in range(group_size(group))]
    if len(chunks) == 1:
        chunks = [p.ds_chunk]
    else:
        dist.all_gather(chunks, p.ds_chunk, group=group)
    return torch.cat(chunks)[: p.ds_shape.numel()].view(p.ds_shape)


def cut(p: torch.Tensor, full: torch.Tensor, group: ProcessGroup | None) -> None:
    """Keep this rank's equal chunk of ``full`` (padded) on ``p`` and empty ``p.data``."""
    dp, rank = group_size(group), group_rank(group)
    flat = full.detach().reshape(-1)
    chunk = -(-flat.numel() // dp)
    mine = flat[rank * chunk : (rank + 1) * chunk]
    p.ds_chunk = torch.zeros(chunk, dtype=flat.dtype, device=flat.device)
    p.ds_chunk[: mine.numel()].copy_(mine)
    p.ds_group = group
    p.data = torch.empty(0, dtype=flat.dtype, device=flat.device)
    mark(p, full.shape, p.ds_chunk, whole=False)  # sets ds_shape too


def forget_construction(p: torch.Tensor) -> None:
    """Drop the construction chunk once the optimizer holds the parameter in its partitions."""
    for name in ("ds_chunk", "ds_group"):
        if hasattr(p, name):
            delattr(p, name)


class PartitionOnConstruction:
    """Context manager: every ``nn.Module`` constructed inside has its parameters cut across the group.

    ``dtype`` casts floating parameters as they are created; ``device`` moves them there first. With
    ``enabled=False`` it does nothing (DeepSpeed's switch for the same code path with and without ZeRO-3).
    """

    def __init__(
        self,
        process_group: ProcessGroup | None = None,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        enabled: bool = True,
    ) -> None:
        self.process_group = process_group
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.enabled = enabled
        self._originals: dict[type, Any] = {}
        self._had_init_subclass = False
        self._apply: Any = None
        self._applying = False

    def __enter__(self) -> PartitionOnConstruction:
        if not self.enabled:
            return self
        if not dist.is_initialized():
            raise RuntimeError(
                "zero.Init needs torch.distributed: call ds_engine.init_distributed() (or "
                "torch.distributed.init_process_group) before building the model"
            )
        for cls in _module_classes():
            self._wrap(cls)
        # classes defined inside the block are wrapped as they are created
        self._had_init_subclass = "__init_subclass__" in nn.Module.__dict__
        ctx = self

        def init_subclass(cls: type, **kwargs: Any) -> None:
            super(nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap(cls)

        nn.Module.__init_subclass__ = classmethod(init_subclass)
        self._wrap_apply()
        return self

    def _wrap_apply(self) -> None:
        """``module.apply(fn)`` on whole parameters: the outermost call gathers the cut ones (rank 0 modifies)."""
        original, ctx = nn.Module.apply, self

        def apply(module: nn.Module, fn: Any) -> nn.Module:
            cut_params = [p for p in module.parameters() if is_constructed_partitioned(p)]
            if ctx._applying or not cut_params:
                return original(module, fn)
            ctx._applying = True
            for p in cut_params:  # whole, as GatheredParameters(cut_params, modifier_rank=0) makes them
                p.data = full_value(p).clone()
                set_status(p, ZeroParamStatus.AVAILABLE)
            try:
                return original(module, fn)
            finally:
                ctx._applying = False
                for p in cut_params:  # rank 0's values, cut again
                    if group_size(p.ds_group) > 1:
                        dist.broadcast(p.data, src=global_rank(p.ds_group, 0), group=p.ds_group)
                    cut(p, p.data, p.ds_group)

        self._apply = original
        nn.Module.apply = apply

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        for cls, original in self._originals.items():
            cls.__init__ = original
        self._originals.clear()
        if not self._had_init_subclass:
            del nn.Module.__init_subclass__
        if self._apply is not None:
            nn.Module.apply = self._apply
            self._apply = None

    def _wrap(self, cls: type) -> None:
        original = cls.__dict__.get("__init__")
        if original is None or cls in self._originals:
            return  # it inherits a wrapped __init__
        ctx = self

        def init(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            depth = module.__dict__.get("_ds_init_depth", 0)
            module.__dict__["_ds_init_depth"] = depth + 1
            try:
                original(module, *args, **kwargs)
            finally:
                module.__dict__["_ds_init_depth"] = depth
            if depth == 0:  # the outermost __init__ of this module: its parameters are final now
                del module.__dict__["_ds_init_depth"]
                ctx.partition_module(module)

        init.__wrapped__ = original
        self._originals[cls] = original
        cls.__init__ = init

    def partition_module(self, module: nn.Module) -> None:
        """Cut every parameter of ``module`` not yet cut (children built earlier already are)."""
        src = global_rank(self.process_group, 0)
        for p in module.parameters():
            if is_constructed_partitioned(p) or hasattr(p, "ds_stage3"):
                continue
            full = p.detach()
            if self.device is not None:
                full = full.to(self.device)
            if self.dtype is not None and full.is_floating_point():
                full = full.to(self.dtype)
            full = full.contiguous().clone() if full.data_ptr() == p.data_ptr() else full.contiguous()
            if group_size(self.process_group) > 1:
                dist.broadcast(full, src=src, group=self.process_group)
            cut(p, full, self.process_group)


def _module_classes() -> list[type]:
    out, stack = [], [nn.Module]
    while stack:
        cls = stack.pop()
        out.append(cls)
        stack.extend(cls.__subclasses__())
    return list(dict.fromkeys(out))

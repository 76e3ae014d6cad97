"""Whole weights from the shards (for 16-bit saves and checkpoints that load into the plain model) and
shards from whole weights (loading those at any tensor-parallel degree)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup

from ._layers import join_shards, shard_info, split_dim

__all__ = ["full_state_dict", "gather_full", "load_full_state_dict", "shard_full"]


def gather_full(tensor: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """The whole of ``tensor`` when it is a tensor-parallel shard (collective over ``group``), else itself."""
    info = shard_info(tensor)
    if info is None or group is None:
        return tensor
    shards = [torch.empty_like(tensor) for _ in range(info.world)]
    dist.all_gather(shards, tensor.detach().contiguous(), group=group)
    return join_shards(shards, info)


def shard_full(full: torch.Tensor, like: torch.Tensor, group: ProcessGroup | None) -> torch.Tensor:
    """This rank's shard of the whole tensor ``full``, split as ``like`` (a parameter of the split model)."""
    info = shard_info(like)
    if info is None or group is None:
        return full
    return split_dim(full, info, dist.get_rank(group))


def full_state_dict(model: nn.Module, group: ProcessGroup | None) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every shard replaced by the whole tensor (collective over ``group``):
    the keys and shapes of the model before it was split."""
    state = model.state_dict()
    params = dict(model.named_parameters(remove_duplicate=False))
    return {k: gather_full(params[k], group).detach() if k in params else v for k, v in state.items()}


def load_full_state_dict(
    model: nn.Module, state: dict[str, torch.Tensor], group: ProcessGroup | None, strict: bool = True
):
    """Load whole tensors (as :func:`full_state_dict` writes them) into the split ``model``."""
    params = dict(model.named_parameters(remove_duplicate=False))
    local = {k: shard_full(v, params[k], group) if k in params else v for k, v in state.items()}
    return model.load_state_dict(local, strict=strict)

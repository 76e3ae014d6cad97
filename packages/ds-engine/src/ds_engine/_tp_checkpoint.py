"""Checkpoints of an AutoTP model: ds-checkpoint's format, holding every parameter's state whole.

Each rank's optimizer holds the state of its tensor-parallel shards (and, at ZeRO 1/2, only its
data-parallel slice of their flat space). Saving puts that state back together into the *logical* flat
space: the whole parameters, in the optimizer's group order, at the offsets an unsplit model's optimizer
uses. Such a checkpoint is exactly what the same model saves without tensor parallelism, so it loads at
any tensor-parallel degree, any data-parallel size and any ZeRO stage 0-2: loading cuts each whole
parameter's state to the shard this rank now holds (by parameter name), then to this rank's slice.
"""

from __future__ import annotations

from typing import Any

import ds_checkpoint
import torch
import torch.distributed as dist
from ds_tpsp.tensor import join_shards, shard_info, split_dim
from torch import nn
from torch.distributed import ProcessGroup

__all__ = ["local_optimizer_state", "logical_optimizer_state"]


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _state_names(tensors: dict[str, torch.Tensor], group: int) -> list[str]:
    """The state names of one group on every rank (a rank whose slice is empty may hold fewer)."""
    prefix = f"g{group}."
    mine = sorted(k[len(prefix) :] for k in tensors if k.startswith(prefix))
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return sorted({name for names in every for name in names})


def logical_optimizer_state(
    shard: tuple[dict[str, torch.Tensor], dict[str, Any]],
    module: nn.Module,
    tp_group: ProcessGroup,
    dp_group: ProcessGroup | None,
    partitioned: bool,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The whole optimizer state of a tensor-parallel model, on every rank (collective over the world).

    ``shard`` is this rank's ``ds-flat-shard/1`` state (its shards' flat space, sliced over ``dp_group``
    when ``partitioned``: ZeRO 1/2). Returns the same format over the whole parameters, shard [0, numel):
    what the unsplit model's optimizer would save."""
    tensors, meta = shard
    params = dict(module.named_parameters())
    tp_world = dist.get_world_size(tp_group)
    out: dict[str, torch.Tensor] = {}
    groups = []
    for gi, gm in enumerate(meta["groups"]):
        s0, s1 = gm["shard"]
        numel = gm["numel"]
        entries, offset = [], 0
        for p in gm["params"]:
            info = shard_info(params[p["name"]])
            shape = list(p["shape"])
            if info is not None:
                shape[info.dim] *= info.world
            entries.append({**p, "shape": shape, "offset": offset})
            offset += _numel(shape)
        for name in _state_names(tensors, gi):
            piece = tensors.get(f"g{gi}.{name}")
            dtype = piece.dtype if piece is not None else torch.float32
            flat = torch.zeros(numel, dtype=dtype)
            if piece is not None:
                flat[s0:s1] = piece.reshape(-1)
            if partitioned and dp_group is not None and dist.get_world_size(dp_group) > 1:
                dist.all_reduce(flat, group=dp_group)  # each element is held by one data-parallel rank
            flats = [torch.empty_like(flat) for _ in range(tp_world)]
            dist.all_gather(flats, flat, group=tp_group)
            whole = []
            for p in gm["params"]:
                n = _numel(p["shape"])
                pieces = [f[p["offset"] : p["offset"] + n].view(p["shape"]) for f in flats]
                info = shard_info(params[p["name"]])
                # a whole parameter is the same on every tensor-parallel rank: the first rank's copy
                whole.append((join_shards(pieces, info) if info is not None else pieces[0]).reshape(-1))
            out[f"g{gi}.{name}"] = torch.cat(whole) if whole else flat[:0]
        groups.append({**gm, "numel": offset, "shard": [0, offset], "params": entries})
    return out, {**meta, "world_size": 1, "rank": 0, "groups": groups}


def local_optimizer_state(
    state: ds_checkpoint.LoadedState,
    mine: dict[str, Any],
    module: nn.Module,
    tp_group: ProcessGroup | None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's optimizer state for its current layout ``mine`` (the meta of its own ``sharded_state_dict``:
    its parameters' shapes and offsets, its slice of each group), cut from a checkpoint of whole parameters.

    Parameters are matched by name; a parameter split over ``tp_group`` takes its shard of the whole state."""
    saved = state.meta["optimizer"]
    if len(saved["groups"]) != len(mine["groups"]):
        raise ds_checkpoint.CheckpointError(
            f"{state.path}: the checkpoint has {len(saved['groups'])} optimizer param groups, this optimizer "
            f"{len(mine['groups'])}; build the optimizer with the same param groups as the run that saved it"
        )
    params = dict(module.named_parameters())
    tp_rank = dist.get_rank(tp_group) if tp_group is not None else 0
    tensors: dict[str, torch.Tensor] = {}
    groups = []
    for gi, (lm, sg) in enumerate(zip(mine["groups"], saved["groups"])):
        by_name = {p["name"]: p for p in sg["params"]}
        s0, s1 = lm["shard"]
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in saved["tensors"]}
        entries = []
        for p in lm["params"]:
            entry = by_name.get(p["name"])
            info = shard_info(params[p["name"]])
            whole_shape = list(p["shape"])
            if info is not None:
                whole_shape[info.dim] *= info.world
            if entry is None or list(entry["shape"]) != whole_shape:
                found = "not in it" if entry is None else f"of shape {entry['shape']} in it"
                raise ds_checkpoint.CheckpointError(
                    f"{state.path}: parameter {p['name']} (whole shape {whole_shape}) is {found}; the model "
                    "differs from the saved one"
                )
            entries.append({**entry, "shape": p["shape"], "offset": p["offset"]})
            lo, hi = max(s0, p["offset"]), min(s1, p["offset"] + _numel(p["shape"]))
            if lo >= hi:
                continue
            start = entry["offset"]
            whole = state.read_shard(gi, start, start + _numel(whole_shape))
            for name, t in whole.items():
                t = t.view(whole_shape)
                local = split_dim(t, info, tp_rank) if info is not None else t
                parts[name].append(local.reshape(-1)[lo - p["offset"] : hi - p["offset"]])
        for name, pieces in parts.items():
            if pieces:
                tensors[f"g{gi}.{name}"] = torch.cat(pieces)
            else:  # an empty slice: keep the saved dtype
                tensors[f"g{gi}.{name}"] = state.read_shard(gi, 0, 0, [name])[name]
        groups.append({**sg, "numel": lm["numel"], "shard": [s0, s1], "params": entries})
    meta = {
        "format": mine["format"],
        "world_size": mine["world_size"],
        "rank": mine["rank"],
        "groups": groups,
        "extra": saved["extra"],
    }
    return tensors, meta

"""ZeRO's sharded optimizer state: the pickle-free, reshardable "ds-flat-shard/1" format."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ._errors import ZeroConfigError
from ._partition import FlatGroup
from ._step import gather_partitions

if TYPE_CHECKING:
    from ._protocol import FlatShardedOptimizer

__all__ = ["SHARD_FORMAT", "load_sharded_state", "sharded_state", "split_group_state"]

SHARD_FORMAT = "ds-flat-shard/1"


def split_group_state(
    state: dict,
    numel: int,
    local: slice,
    group: int,
    tensors: dict[str, torch.Tensor],
    tensor_scalars: set[str],
) -> dict:
    """One group's optimizer state: element-wise tensors (``numel`` long) go into ``tensors`` as this
    rank's ``local`` slice under ``g{group}.<key>``; scalars are returned (tensor scalars noted in
    ``tensor_scalars`` so they load back as tensors). Shared by stages 1/2 and stage 3."""
    scalars = {}
    for key, value in state.items():
        if torch.is_tensor(value) and value.dim() == 1 and value.numel() == numel:
            tensors[f"g{group}.{key}"] = value.detach()[local].cpu().clone()
        elif torch.is_tensor(value) and value.numel() == 1:
            scalars[key] = value.item()
            tensor_scalars.add(key)
        elif isinstance(value, int | float | bool):
            scalars[key] = value
        else:
            raise ZeroConfigError(
                f"optimizer state {key!r} of group {group} is neither element-wise nor a scalar, so it "
                "cannot be sharded"
            )
    return scalars


def sharded_state(zero: FlatShardedOptimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """This rank's optimizer state, padding stripped: ``(tensors, meta)``."""
    tensors: dict[str, torch.Tensor] = {}
    groups_meta = []
    tensor_scalars: set[str] = set()
    for g in zero.groups:
        s0, s1 = g.layout.shard(g.rank)
        local = slice(s0 - g.partition[0], s1 - g.partition[0])
        tensors[f"g{g.index}.master"] = g.master.detach()[local].cpu().clone()
        state = zero.optimizer.state.get(g.master, {})
        scalars = split_group_state(state, g.master.numel(), local, g.index, tensors, tensor_scalars)
        groups_meta.append(
            {
                "numel": g.layout.numel,
                "shard": [s0, s1],
                "params": [
                    {"name": n, "shape": list(p.shape), "offset": off}
                    for n, p, off in zip(g.names, g.params, g.layout.offsets)
                ],
                "hparams": {k: _jsonable(v) for k, v in g.opt_group.items() if k != "params"},
                "scalars": scalars,
            }
        )
    extra = {"zero_stage": zero.stage, "tensor_scalars": sorted(tensor_scalars), **zero.step_state()}
    meta = {
        "format": SHARD_FORMAT,
        "world_size": zero.dp,
        "rank": zero.rank,
        "groups": groups_meta,
        "extra": extra,
    }
    return tensors, meta


def load_sharded_state(zero: FlatShardedOptimizer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """Load this rank's slice of the NEW partitioning (resharded by the caller); collective."""
    if meta.get("format") != SHARD_FORMAT:
        raise ZeroConfigError(f"optimizer shard format {meta.get('format')!r} is not {SHARD_FORMAT!r}")
    if len(meta["groups"]) != len(zero.groups):
        raise ZeroConfigError(
            f"checkpoint has {len(meta['groups'])} param groups, the optimizer has "
            f"{len(zero.groups)}; build the optimizer with the same groups"
        )
    tensor_scalars = set(meta.get("extra", {}).get("tensor_scalars", []))
    for g, gm in zip(zero.groups, meta["groups"]):
        _load_group(zero, g, gm, tensors, tensor_scalars)
        g.write_master_back()
        opts = zero.options
        # over the group's own ranks (an expert group's expert-data-parallel ranks; else the optimizer's)
        pg = g.process_group if g.process_group is not None else zero.process_group
        gather_partitions(g, pg, opts.allgather_bucket_size, opts.allgather_partitions)
    zero.load_step_state(meta.get("extra", {}))


def _load_group(
    zero: FlatShardedOptimizer,
    g: FlatGroup,
    gm: dict,
    tensors: dict[str, torch.Tensor],
    tensor_scalars: set[str],
) -> None:
    if gm["numel"] != g.layout.numel:
        raise ZeroConfigError(
            f"param group {g.index}: checkpoint holds {gm['numel']} elements, the model "
            f"{g.layout.numel}; the model's trainable parameters must match"
        )
    s0, s1 = g.layout.shard(g.rank)
    ps = g.partition[0]
    prefix = f"g{g.index}."
    state: dict = {}
    for key, t in tensors.items():
        if not key.startswith(prefix):
            continue
        if t.numel() != s1 - s0:
            raise ZeroConfigError(
                f"{key} has {t.numel()} elements but rank {g.rank} owns [{s0}, {s1}) "
                "of the group: pass this rank's slice of the new partitioning"
            )
        full = torch.zeros(g.master.numel(), dtype=t.dtype, device=g.master.device)
        full[s0 - ps : s1 - ps].copy_(t.reshape(-1))
        name = key[len(prefix) :]
        if name == "master":
            with torch.no_grad():
                g.master.copy_(full)
        else:
            state[name] = full
    for key, value in gm.get("scalars", {}).items():
        state[key] = torch.tensor(float(value), dtype=torch.float32) if key in tensor_scalars else value
    if state:
        zero.optimizer.state[g.master] = state
    for key, value in gm.get("hparams", {}).items():
        if key in g.opt_group:
            current = g.opt_group[key]
            g.opt_group[key] = tuple(value) if isinstance(current, tuple) else value


def _jsonable(value):
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return repr(value)

"""Stage 3 optimizer state in the ``ds-flat-shard/1`` format (the one of stages 1 and 2).

Each rank writes the unpadded part of its partition of each group's flat space: the fp32 master and
every element-wise optimizer state tensor, plus the group's parameter names, shapes and offsets. A
stage-3 rank owns the same range a stage-1/2 rank owns, so checkpoints reshard across stages.
"""

from __future__ import annotations

import torch

from .._errors import ZeroConfigError
from .._state import split_group_state
from ._partition import PartitionedParams
from ._subgroups import SubGroups

__all__ = ["SHARD_FORMAT", "load_sharded", "sharded_state"]

SHARD_FORMAT = "ds-flat-shard/1"


def sharded_state(
    params: PartitionedParams,
    masters: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    sub_groups: SubGroups,
    extra: dict,
) -> tuple[dict[str, torch.Tensor], dict]:
    """This rank's slice of every group: ``g{i}.master`` and ``g{i}.<state>`` tensors, and the meta."""
    tensors: dict[str, torch.Tensor] = {}
    groups_meta = []
    tensor_scalars: set[str] = set()
    slots_by_group = _slots_by_group(params)
    for g, (layout, master, opt_group) in enumerate(zip(params.layouts, masters, optimizer.param_groups)):
        s0, s1 = layout.shard(params.rank)
        ps = layout.partition_range(params.rank)[0]
        local = slice(s0 - ps, s1 - ps)
        tensors[f"g{g}.master"] = master.detach()[local].cpu().clone()
        state = sub_groups.state_of(optimizer, g)
        scalars = split_group_state(state, master.numel(), local, g, tensors, tensor_scalars)
        groups_meta.append(
            {
                "numel": layout.numel,
                "shard": [s0, s1],
                "params": [
                    {"name": s.name, "shape": list(s.shape), "offset": s.start} for s in slots_by_group[g]
                ],
                "hparams": {k: _jsonable(v) for k, v in opt_group.items() if k != "params"},
                "scalars": scalars,
            }
        )
    meta = {
        "format": SHARD_FORMAT,
        "world_size": params.dp,
        "rank": params.rank,
        "groups": groups_meta,
        "extra": {**extra, "tensor_scalars": sorted(tensor_scalars)},
    }
    return tensors, meta


def load_sharded(
    params: PartitionedParams,
    masters: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    sub_groups: SubGroups,
    tensors: dict[str, torch.Tensor],
    meta: dict,
) -> None:
    """Restore masters and optimizer state from this rank's slice of the new partitioning."""
    if meta.get("format") != SHARD_FORMAT:
        raise ZeroConfigError(f"optimizer shard format {meta.get('format')!r} is not {SHARD_FORMAT!r}")
    if len(meta["groups"]) != len(params.layouts):
        raise ZeroConfigError(
            f"checkpoint has {len(meta['groups'])} param groups, the optimizer has {len(params.layouts)}; "
            "build the optimizer with the same groups"
        )
    tensor_scalars = set(meta.get("extra", {}).get("tensor_scalars", []))
    for g, gm in enumerate(meta["groups"]):
        layout, master, opt_group = params.layouts[g], masters[g], optimizer.param_groups[g]
        if gm["numel"] != layout.numel:
            raise ZeroConfigError(
                f"param group {g}: checkpoint holds {gm['numel']} elements, the model {layout.numel}; "
                "the model's trainable parameters must match"
            )
        s0, s1 = layout.shard(params.rank)
        ps = layout.partition_range(params.rank)[0]
        state: dict = {}
        for key, t in tensors.items():
            if not key.startswith(f"g{g}."):
                continue
            if t.numel() != s1 - s0:
                raise ZeroConfigError(f"{key} has {t.numel()} elements, rank {params.rank} owns [{s0}, {s1})")
            full = torch.zeros(master.numel(), dtype=t.dtype, device=master.device)
            full[s0 - ps : s1 - ps].copy_(t.reshape(-1))
            name = key[len(f"g{g}.") :]
            if name == "master":
                with torch.no_grad():
                    master.copy_(full)
            else:
                state[name] = full
        for key, value in gm.get("scalars", {}).items():
            state[key] = torch.tensor(float(value), dtype=torch.float32) if key in tensor_scalars else value
        if state:
            sub_groups.load_state(optimizer, g, state)
        for key, value in gm.get("hparams", {}).items():
            if key in opt_group:
                opt_group[key] = tuple(value) if isinstance(opt_group[key], tuple) else value


def _slots_by_group(params: PartitionedParams) -> list[list]:
    out: list[list] = [[] for _ in params.layouts]
    for s in params.slots.values():
        if s.frozen is None:  # frozen parameters (``_frozen``) have no place in the groups
            out[s.group].append(s)
    for slots in out:
        slots.sort(key=lambda s: s.start)
    return out


def _jsonable(value: object) -> object:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if torch.is_tensor(value):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, int | float | bool | str) or value is None:
        return value
    return repr(value)

"""DeepSpeed ZeRO 3 checkpoints: reassemble whole parameters from the ranks' per-parameter partitions.

ZeRO 3 writes a model file per rank whose partitioned parameters are empty placeholders, and partitions
every parameter on its own: rank r holds elements [r*c, (r+1)*c) of each parameter (c = ceil(numel /
ranks), the last rank's slice zero-padded), concatenated in group order as ``fp32_flat_groups[g]``; the
Adam moments of that flat partition follow the same layout.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from ._deepspeed_files import group_meta, safe_torch_load, shard_meta
from ._errors import CheckpointCorruptError, DeepSpeedImportError


def _unpartition(per_rank: list[torch.Tensor], shapes: dict[str, Any], what: str) -> torch.Tensor:
    """A group's unpadded flat space from ZeRO 3's per-rank flat partitions (layout: module docstring)."""
    world, size = len(per_rank), per_rank[0].numel()
    if any(t.numel() != size for t in per_rank):
        raise CheckpointCorruptError(
            f"{what}: the ranks' partitions differ in size {[t.numel() for t in per_rank]}"
        )
    pieces, offset = [], 0
    for name, shape in shapes.items():
        numel = torch.Size(shape).numel()
        chunk = -(-numel // world)
        if offset + chunk > size:
            raise CheckpointCorruptError(
                f"{what}: partitions of {size} elements end before parameter {name!r} {list(shape)}"
            )
        whole = torch.cat([t.reshape(-1)[offset : offset + chunk] for t in per_rank])
        pieces.append(whole[:numel].float())
        offset += chunk
    # elements past the last parameter (if any) are alignment padding at the partition's end
    return torch.cat(pieces) if pieces else torch.empty(0)


def zero3_shard(osds: list[dict[str, Any]], shapes: list[dict], paths: list[Path]) -> tuple[dict, dict]:
    """One whole ``ds-flat-shard/1`` shard (world size 1) from the ranks' ZeRO 3 optimizer states."""
    tensors, groups = {}, []
    for g, names_shapes in enumerate(shapes):
        bases = [osd["optimizer_state_dict"]["state"] for osd in osds]
        states = [base.get(g, base.get(str(g), {})) for base in bases]
        hparams = osds[0]["optimizer_state_dict"]["param_groups"][g]
        meta = group_meta(names_shapes, hparams, states[0].get("step", 0))
        meta["shard"] = [0, meta["numel"]]
        groups.append(meta)
        what = f"{paths[0].parent} group {g}"
        tensors[f"g{g}.master"] = _unpartition([o["fp32_flat_groups"][g] for o in osds], names_shapes, what)
        for key in ("exp_avg", "exp_avg_sq"):
            if all(key in st for st in states):
                tensors[f"g{g}.{key}"] = _unpartition([st[key] for st in states], names_shapes, what)
    return tensors, shard_meta(osds[0], groups, 0, 1)


def zero3_module(model: dict[str, Any], shard: tuple[dict, dict], path: Path) -> dict[str, torch.Tensor]:
    """The module state with ZeRO 3's empty placeholders replaced by the fp32 masters (in their dtype)."""
    if model.get("frozen_param_shapes"):
        raise DeepSpeedImportError(
            f"{path}: frozen (requires_grad=False) parameters {sorted(model['frozen_param_shapes'])} are "
            "partitioned in per-rank fragments that ds cannot import yet; unfreeze them before saving"
        )
    tensors, meta = shard
    full = {}
    for g, group in enumerate(meta["groups"]):
        for p in group["params"]:
            numel = torch.Size(p["shape"]).numel()
            full[p["name"]] = tensors[f"g{g}.master"][p["offset"] : p["offset"] + numel].view(p["shape"])
    # a tied parameter is stored once; DeepSpeed records its other names as {alias: stored name}
    for alias, source in (model.get("shared_params") or {}).items():
        full[alias] = full[source]
    state = {}
    for name, tensor in model["module"].items():
        if name in full:
            state[name] = full[name].to(tensor.dtype).clone()
        elif tensor.numel() == 0 and name not in (model.get("buffer_names") or []):
            raise DeepSpeedImportError(
                f"{path}: module entry {name!r} is a placeholder with no saved parameter"
            )
        else:
            state[name] = tensor
    return state


def warn_if_buffers_differ(tag_dir: Path, rank0: dict[str, torch.Tensor], world: int) -> None:
    """ZeRO 3 saves each rank's own buffers (BatchNorm statistics may differ by rank); ds keeps rank 0's
    for every rank, as a ZeRO 0-2 DeepSpeed checkpoint (one model file) does: say so when they differ."""
    differ = set()
    for r in range(1, world):
        other = safe_torch_load(tag_dir / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")["module"]
        differ |= {k for k, v in rank0.items() if v.numel() and k in other and not torch.equal(v, other[k])}
    if differ:
        warnings.warn(
            f"{tag_dir}: the ranks saved different values for buffers {sorted(differ)}; the import uses "
            "rank 0's on every rank (DeepSpeed's ZeRO-3 resume would give each rank its own)",
            stacklevel=3,
        )

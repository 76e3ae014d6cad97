"""The ``ds-flat-shard/1`` optimizer-state format (docs/architecture.md) for the whole flat space.

Element-wise optimizer state (same shape as the parameter, e.g. Adam's ``exp_avg``) is concatenated
into one flat fp32 tensor per key and group; scalar state (``step``) goes to the JSON metadata, per
group, with per-parameter overrides only where parameters disagree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ._flat import FlatGroup

__all__ = ["FORMAT", "load_flat_state", "save_flat_state"]

FORMAT = "ds-flat-shard/1"


def _json_value(key: str, value: Any) -> Any:
    if torch.is_tensor(value):
        if value.numel() != 1:
            raise TypeError(
                f"optimizer option {key!r} is a tensor of {value.numel()} elements; only scalars are saved"
            )
        return value.item()
    if isinstance(value, tuple | list):
        return [_json_value(key, v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"optimizer option {key!r} has type {type(value).__name__}, which cannot be saved as JSON"
    )


def _restore_value(current: Any, saved: Any) -> Any:
    """``saved`` (a JSON value) in the Python type the live param group uses for that option."""
    if torch.is_tensor(current):
        return current.fill_(saved) if current.numel() == 1 else current
    if isinstance(current, tuple):
        return tuple(saved)
    return saved


def _split_state(
    optimizer: torch.optim.Optimizer, flat: FlatGroup
) -> tuple[dict[str, list[torch.Tensor | None]], list[dict[str, Any]], set[str]]:
    """Per parameter: element-wise tensors by key, and scalars; plus which scalars were tensors."""
    elementwise: dict[str, list[torch.Tensor | None]] = {}
    scalars: list[dict[str, Any]] = []
    tensor_scalars: set[str] = set()
    for i, m in enumerate(flat.masters):
        own: dict[str, Any] = {}
        for key, value in optimizer.state.get(m, {}).items():
            if torch.is_tensor(value) and value.dim() > 0:
                if value.shape != m.shape:
                    raise ValueError(
                        f"{type(optimizer).__name__} keeps state {key!r} of shape {tuple(value.shape)} for "
                        f"parameter {flat.names[i]} of shape {tuple(m.shape)}; the flat checkpoint format "
                        "holds only element-wise and scalar optimizer state"
                    )
                elementwise.setdefault(key, [None] * len(flat.masters))[i] = value
            elif torch.is_tensor(value):
                own[key] = value.item()
                tensor_scalars.add(key)
            else:
                own[key] = _json_value(key, value)
        scalars.append(own)
    return elementwise, scalars, tensor_scalars


def _flat_of(parts: list[torch.Tensor | None], flat: FlatGroup) -> torch.Tensor:
    out = torch.zeros(flat.numel, dtype=torch.float32, device=flat.flat_master.device)
    for part, off in zip(parts, flat.offsets):
        if part is not None:
            out[off : off + part.numel()].copy_(part.reshape(-1))
    return out


def save_flat_state(
    optimizer: torch.optim.Optimizer, groups: list[FlatGroup], extra: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, meta)`` for the whole flat space of every group (copies, safe to keep)."""
    tensors: dict[str, torch.Tensor] = {}
    group_metas = []
    all_tensor_scalars: set[str] = set()
    for gi, (flat, pg) in enumerate(zip(groups, optimizer.param_groups)):
        tensors[f"g{gi}.master"] = flat.flat_master.detach().to(torch.float32, copy=True)
        elementwise, scalars, tensor_scalars = _split_state(optimizer, flat)
        all_tensor_scalars |= tensor_scalars
        for key, parts in elementwise.items():
            tensors[f"g{gi}.{key}"] = _flat_of(parts, flat)
        group_scalars = _common_scalars(scalars)
        params = []
        for i, p in enumerate(flat.model_params):
            entry: dict[str, Any] = {"name": flat.names[i], "shape": list(p.shape), "offset": flat.offsets[i]}
            if flat.masters[i] not in optimizer.state:
                entry["has_state"] = False
            own = {k: v for k, v in scalars[i].items() if group_scalars.get(k) != v}
            if own:
                entry["scalars"] = own
            params.append(entry)
        hparams = {k: _json_value(k, v) for k, v in pg.items() if k != "params"}
        group_metas.append(
            {
                "numel": flat.numel,
                "shard": [0, flat.numel],
                "params": params,
                "hparams": hparams,
                "scalars": group_scalars,
            }
        )
    extra = {**extra, "tensor_scalars": sorted(all_tensor_scalars)}
    meta = {"format": FORMAT, "world_size": 1, "rank": 0, "groups": group_metas, "extra": extra}
    return tensors, meta


def _common_scalars(scalars: list[dict[str, Any]]) -> dict[str, Any]:
    """The most frequent value of each scalar key among the parameters that have state."""
    keys = {k for s in scalars for k in s}
    common = {}
    for key in sorted(keys):
        values = Counter(repr(s[key]) for s in scalars if key in s)
        top = values.most_common(1)[0][0]
        common[key] = next(s[key] for s in scalars if key in s and repr(s[key]) == top)
    return common


def _check_layout(groups: list[FlatGroup], meta: dict[str, Any]) -> None:
    if meta.get("format") != FORMAT:
        raise ValueError(f"optimizer state has format {meta.get('format')!r}; expected {FORMAT!r}")
    saved = meta["groups"]
    if len(saved) != len(groups):
        raise ValueError(
            f"the checkpoint has {len(saved)} optimizer param groups but this optimizer has {len(groups)}: "
            "build the optimizer with the same param groups as the run that saved it"
        )
    for gi, (flat, g) in enumerate(zip(groups, saved)):
        if g["numel"] != flat.numel or g["shard"] != [0, g["numel"]]:
            raise ValueError(
                f"param group {gi}: the checkpoint holds elements {g['shard']} of {g['numel']} but this "
                f"optimizer needs all {flat.numel}; read the whole flat space (read_shard(..., 0, numel))"
            )
        for i, (p, entry) in enumerate(zip(flat.model_params, g["params"])):
            if list(p.shape) != entry["shape"]:
                raise ValueError(
                    f"param group {gi}, parameter {i} ({flat.names[i]}): shape {list(p.shape)} here but "
                    f"{entry['shape']} ({entry['name']}) in the checkpoint; the model differs from the saved one"
                )


def load_flat_state(
    optimizer: torch.optim.Optimizer,
    groups: list[FlatGroup],
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Restore master weights, inner optimizer state and options; return ``meta["extra"]``."""
    _check_layout(groups, meta)
    extra = meta.get("extra", {})
    tensor_scalars = set(extra.get("tensor_scalars", []))
    state: dict[int, dict[str, Any]] = {}
    saved_groups: list[dict[str, Any]] = []
    index = 0
    for gi, (flat, g, pg) in enumerate(zip(groups, meta["groups"], optimizer.param_groups)):
        with torch.no_grad():
            flat.flat_master.copy_(tensors[f"g{gi}.master"])
        prefix = f"g{gi}."
        keys = [k[len(prefix) :] for k in tensors if k.startswith(prefix) and k != f"{prefix}master"]
        for i, (m, entry) in enumerate(zip(flat.masters, g["params"])):
            if entry.get("has_state", True):
                st: dict[str, Any] = {
                    k: tensors[prefix + k][flat.offsets[i] : flat.offsets[i] + m.numel()].view_as(m).clone()
                    for k in keys
                }
                for k, v in {**g["scalars"], **entry.get("scalars", {})}.items():
                    st[k] = torch.tensor(v, dtype=torch.float32) if k in tensor_scalars else v
                state[index + i] = st
        for k, v in g["hparams"].items():
            pg[k] = _restore_value(pg.get(k), v)
        saved_groups.append({**pg, "params": list(range(index, index + len(flat.masters)))})
        index += len(flat.masters)
    # torch's own loader casts each state tensor to its parameter's dtype and device
    optimizer.load_state_dict({"state": state, "param_groups": saved_groups})
    return extra

"""Read checkpoints written by the ``deepspeed`` package (ZeRO 0-3) without unpickling its classes.

Files are read by ``_deepspeed_files.safe_torch_load`` (weights_only and a four-name allow-list).
ZeRO 0-2 write one ``mp_rank_00_model_states.pt`` with the full module; ZeRO 1/2 split each optimizer
group's flat (concatenated) fp32 space into one contiguous range per rank, which maps onto
``ds-flat-shard/1`` shards directly. ZeRO 3 (``_deepspeed_zero3``) is reassembled into whole groups.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ._deepspeed_files import (
    PickledState,
    group_meta,
    optimizer_state,
    plain,
    safe_torch_load,
    shard_meta,
)
from ._deepspeed_zero3 import warn_if_buffers_differ, zero3_module, zero3_shard
from ._errors import CheckpointCorruptError, CheckpointNotFoundError, DeepSpeedImportError
from ._load import covering_pieces, new_shard_meta
from ._save import save_state

__all__ = ["DeepSpeedCheckpoint", "PickledState", "load_deepspeed", "safe_torch_load"]

MODEL_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
    "csr_tensor_module_names", "skipped_steps", "global_steps", "global_samples", "dp_world_size",
    "mp_world_size", "ds_config", "ds_version", "checkpoint_parallel_dimensions",
}  # fmt: skip


@dataclass
class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint converted to this package's in-memory format."""

    path: Path
    zero_stage: int
    world_size: int
    model_state: dict[str, torch.Tensor]
    # ds-flat-shard/1: one per saved rank (ZeRO 1/2), one whole shard (ZeRO 0 and 3)
    shards: list[tuple[dict[str, torch.Tensor], dict[str, Any]]]
    lr_scheduler: dict[str, Any] | None
    loss_scaler: dict[str, Any] | None
    counters: dict[str, Any]
    client_state: dict[str, Any]
    ds_config: dict[str, Any] | None

    def read_shard(self, group: int, start: int, end: int) -> dict[str, torch.Tensor]:
        """Elements [start, end) of a group's flat space for every optimizer state."""
        owners = [(r, *meta["groups"][group]["shard"]) for r, (_, meta) in enumerate(self.shards)]
        pieces = covering_pieces(owners, start, end, f"{self.path} group {group}")
        names = [k.partition(".")[2] for k in self.shards[0][0] if k.startswith(f"g{group}.")]
        out = {}
        for state in names:
            parts = [self.shards[r][0][f"g{group}.{state}"][lo - self.shards[r][1]["groups"][group]["shard"][0] :
                                                             hi - self.shards[r][1]["groups"][group]["shard"][0]]
                     for r, lo, hi in pieces]  # fmt: skip
            out[state] = torch.cat(parts) if parts else torch.empty(0)
        return out

    def optimizer_shard(self, shards: list[tuple[int, int]], rank: int, world_size: int):
        """This rank's ``ds-flat-shard/1`` state for a new partitioning (one [start, end) per group)."""
        first = self.shards[0][1]
        groups = [{k: v for k, v in g.items() if k != "shard"} for g in first["groups"]]
        meta = new_shard_meta(groups, first["extra"], shards, rank, world_size)
        tensors = {
            f"g{g}.{k}": v for g, (s, e) in enumerate(shards) for k, v in self.read_shard(g, s, e).items()
        }
        return tensors, meta

    def save(self, save_dir: str | os.PathLike, tag: str) -> Path:
        """Write it in this package's format from one process, loadable at any world size.

        The optimizer state is merged into one whole shard (like DeepSpeed's zero_to_fp32, this
        holds the full optimizer state in memory once).
        """
        whole = None
        if self.shards:
            whole = self.optimizer_shard([(0, g["numel"]) for g in self.shards[0][1]["groups"]], 0, 1)
        path = save_state(
            save_dir, tag, model_state=self.model_state, optimizer_shard=whole,
            lr_scheduler=self.lr_scheduler, loss_scaler=self.loss_scaler, counters=self.counters,
            client_state=self.client_state, config=self.ds_config, save_rng=False,
        )  # fmt: skip
        return path


def _zero0_shard(model: dict[str, Any], path: Path, param_names: list[str] | None) -> list[tuple[dict, dict]]:
    osd = model.get("optimizer")
    if not osd:
        return []
    if "state" not in osd or "param_groups" not in osd:
        raise DeepSpeedImportError(
            f"{path}: the 'optimizer' entry is a DeepSpeed wrapper state ({sorted(osd)[:6]}...); only a plain "
            "torch optimizer state_dict is supported for ZeRO stage 0"
        )
    buffers = set(model.get("buffer_names") or [])
    # DeepSpeed records no names for stage 0. Default: the module's non-buffer entries in order,
    # which is the optimizer's order when it was built from model.parameters(); shapes are checked.
    names = param_names or [n for n in model["module"] if n not in buffers]
    tensors, groups, index = {}, [], 0
    for g, pg in enumerate(osd["param_groups"]):
        shapes = {}
        for i in pg["params"]:
            if index >= len(names):
                raise DeepSpeedImportError(f"{path}: the optimizer has more parameters than the module")
            name = names[index]
            saved = osd["state"].get(i, {}).get("exp_avg")
            if name not in model["module"] or (
                saved is not None and saved.shape != model["module"][name].shape
            ):
                raise DeepSpeedImportError(
                    f"{path}: optimizer parameter {i} does not match module entry {name!r} (DeepSpeed saves no "
                    "parameter names at ZeRO stage 0); pass param_names=[...] in the optimizer's parameter order"
                )
            shapes[name] = list(model["module"][name].shape)
            index += 1
        states = [osd["state"].get(i, {}) for i in pg["params"]]
        # the group's step count: torch's Adam gives it to every parameter; DeepSpeed's FusedAdam counts only
        # in its group's last parameter (the others keep the count they were created with)
        meta = group_meta(shapes, pg, max((plain(st.get("step", 0)) for st in states), default=0))
        meta["shard"] = [0, meta["numel"]]
        groups.append(meta)
        tensors[f"g{g}.master"] = torch.cat([model["module"][n].float().reshape(-1) for n in shapes])
        for key in ("exp_avg", "exp_avg_sq"):
            if all(key in s for s in states):
                tensors[f"g{g}.{key}"] = torch.cat([s[key].float().reshape(-1) for s in states])
    return [(tensors, shard_meta(osd, groups, 0, 1))]


def _zero_shard(
    osd: dict[str, Any], shapes: list[dict], rank: int, world: int, path: Path
) -> tuple[dict, dict]:
    if any(any(p) for p in osd.get("param_alignment_paddings", [])):
        raise DeepSpeedImportError(f"{path}: per-parameter alignment padding is not supported")
    base = osd["base_optimizer_state"]
    paddings = osd.get("group_paddings") or [0] * len(shapes)
    tensors, groups = {}, []
    for g, fp32 in enumerate(osd["single_partition_of_fp32_groups"]):  # padding already stripped
        state = base["state"].get(g, base["state"].get(str(g), {}))
        partition_numel = fp32.numel() + paddings[g]
        meta = group_meta(shapes[g], base["param_groups"][g], state.get("step", 0))
        start = rank * partition_numel
        meta["shard"] = [min(start, meta["numel"]), min(start + fp32.numel(), meta["numel"])]
        if meta["shard"][1] - meta["shard"][0] != fp32.numel():
            raise CheckpointCorruptError(f"{path}: group {g} partition does not fit the parameter shapes")
        groups.append(meta)
        tensors[f"g{g}.master"] = fp32.float().clone()
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"g{g}.{key}"] = state[key].float().reshape(-1)[: fp32.numel()].clone()
    return tensors, shard_meta(osd, groups, rank, world)


def load_deepspeed(
    ckpt_dir: str | os.PathLike, tag: str | None = None, *, param_names: list[str] | None = None
) -> DeepSpeedCheckpoint:
    """Read a DeepSpeed ZeRO 0/1/2/3 checkpoint from ``ckpt_dir`` (``tag``, default: ``latest``).

    ``param_names`` (ZeRO 0 only, where DeepSpeed stores no names): the module state-dict names
    of the optimizer's parameters in optimizer order; default: the module's parameter order.
    Files are loaded with the allow-list described in _deepspeed_files.
    """
    ckpt_dir = Path(ckpt_dir)
    if tag is None:
        latest = ckpt_dir / "latest"
        if not latest.is_file():
            raise CheckpointNotFoundError(f"{latest} does not exist: pass the tag explicitly")
        tag = latest.read_text().strip()
    tag_dir = ckpt_dir / str(tag)
    model_path = tag_dir / "mp_rank_00_model_states.pt"
    if not model_path.exists() and (tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt").exists():
        model_path = tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt"  # ZeRO 3: one per rank
    model = safe_torch_load(model_path)
    if not isinstance(model, dict) or "module" not in model:
        raise DeepSpeedImportError(f"{model_path} has no 'module' entry")
    world = int(model.get("dp_world_size", 1))
    module_state = dict(model["module"].items())
    if model.get("param_shapes") is None:  # no ZeRO: optimizer state lives in the model file
        shards, stage = _zero0_shard(model, model_path, param_names), 0
    else:
        prefix = "bf16_" if (tag_dir / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt").exists() else ""
        paths = [tag_dir / f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
        osds = [optimizer_state(path) for path in paths]
        stage = int(osds[0].get("zero_stage", 1))
        if stage == 3:
            shards = [zero3_shard(osds, model["param_shapes"], paths)]
            module_state = zero3_module(model, shards[0], model_path)
            warn_if_buffers_differ(tag_dir, model["module"], world)
        else:
            shards = [
                _zero_shard(o, model["param_shapes"], r, world, p)
                for r, (o, p) in enumerate(zip(osds, paths))
            ]
    loss_scaler = shards[0][1]["extra"].get("loss_scaler") if shards else None
    return DeepSpeedCheckpoint(
        path=tag_dir,
        zero_stage=stage,
        world_size=world,
        model_state=module_state,
        shards=shards,
        lr_scheduler=plain(model.get("lr_scheduler")),
        loss_scaler=loss_scaler,
        counters={k: model.get(k, 0) for k in ("global_steps", "global_samples", "skipped_steps")},
        client_state={k: v for k, v in model.items() if k not in MODEL_KEYS},
        ds_config=model.get("ds_config"),
    )

"""Checkpoints of a pipeline: the weights in one file per layer, the rest per stage.

Layout under ``save_dir/<tag>/``: ``layer_XX-model_states.safetensors`` (each layer's state dict, written
by data-parallel rank 0 of the stage that holds it: DeepSpeed's per-layer naming, ds's pickle-free
format), ``pipe.json`` (stages and layer boundaries) and ``stage_XX/state/`` (each stage's optimizer
shards, LR schedule, counters and client state: ds_checkpoint's ``save_state``, atomic, any data-parallel
size). Weights load at any pipeline degree (each stage reads the files of the layers it now holds; a
one-stage PipelineModule is the whole model); the optimizer state only at the degree it was saved with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import ds_checkpoint
import safetensors.torch
import torch
import torch.distributed as dist

__all__ = ["PipelineCheckpointError", "load_pipeline_checkpoint", "save_pipeline_checkpoint"]


class PipelineCheckpointError(ds_checkpoint.CheckpointError):
    """A pipeline checkpoint that cannot be loaded as asked (another degree with optimizer states)."""


def _layer_file(root: Path, idx: int) -> Path:
    return root / f"layer_{idx:02d}-model_states.safetensors"


def _stateful_layers(module: Any) -> list[tuple[int, torch.nn.Module]]:
    """(global layer index, module) of this stage's layers that hold state (a tied layer given a forward_fn
    holds none of its own: its weights are the tied module's, saved where that is a layer itself)."""
    start, _ = module.layer_range()
    return [(start + i, f) for i, f in enumerate(module.forward_funcs) if isinstance(f, torch.nn.Module)]


def save_pipeline_checkpoint(engine: Any, save_dir: str | os.PathLike, tag: str, client_state: dict) -> None:
    module, grid = engine.module, engine.grid
    root = Path(save_dir) / tag
    if grid.data_parallel_id == 0:
        for idx, layer in _stateful_layers(module):
            state = layer.state_dict()
            if state:
                path = _layer_file(root, idx)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                safetensors.torch.save_file(
                    {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}, tmp
                )
                os.replace(tmp, path)
    ds_checkpoint.save_state(
        root / f"stage_{grid.stage_id:02d}",  # a folder per stage: each stage's save cleans its own leftovers
        "state",
        optimizer_shard=engine._sharded_state(),
        lr_scheduler=engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
        counters=engine._counters(),
        client_state=client_state,
        config=engine.ds_config.model_dump(mode="json"),
        save_latest=False,
        group=grid.dp_proc_group,
    )
    dist.barrier()
    if dist.get_rank() == 0:
        (root / "pipe.json").write_text(
            json.dumps({"stages": grid.pipe_parallel_size, "parts": [int(p) for p in module.parts]})
        )
        latest = Path(save_dir) / "latest"
        latest.with_name(".latest.tmp").write_text(tag)
        os.replace(latest.with_name(".latest.tmp"), latest)
    dist.barrier()


def load_pipeline_checkpoint(
    engine: Any,
    load_dir: str | os.PathLike,
    tag: str | None,
    *,
    strict: bool,
    load_optimizer_states: bool,
    load_lr_scheduler_states: bool,
    load_module_only: bool,
) -> tuple[str | None, dict | None]:
    module, grid = engine.module, engine.grid
    if tag is None:
        latest = Path(load_dir) / "latest"
        if not latest.exists():
            return None, None
        tag = latest.read_text().strip()
    root = Path(load_dir) / str(tag)
    if not (root / "pipe.json").exists() and any(root.glob("layer_*-model_states.pt")):
        return _import_deepspeed_layers(
            engine, root, strict=strict, load_optimizer_states=load_optimizer_states
        )
    saved = json.loads((root / "pipe.json").read_text())
    for idx, layer in _stateful_layers(module):
        path = _layer_file(root, idx)
        if path.exists():
            layer.load_state_dict(safetensors.torch.load_file(str(path)), strict=strict)
        elif layer.state_dict():
            raise PipelineCheckpointError(
                f"stage {grid.stage_id}: {module.layer_name(idx)} has no weights file {path.name} in {root}"
            )
    module.synchronize_tied_weights()
    same_layout = saved["stages"] == grid.pipe_parallel_size and saved["parts"] == [
        int(p) for p in module.parts
    ]
    if load_module_only:
        if engine._sharded_state() is not None:
            engine._refresh_master_from_weights()
        return str(root), {}
    if load_optimizer_states and not same_layout:
        raise PipelineCheckpointError(
            f"{root} was saved at {saved['stages']} pipeline stages (layers {saved['parts']}); this run has "
            f"{grid.pipe_parallel_size} (layers {list(module.parts)}): the optimizer state belongs to the old "
            "stages. Load the weights only: load_checkpoint(..., load_optimizer_states=False)"
        )
    stage = grid.stage_id if same_layout else 0  # schedule and counters are the same on every stage
    state = ds_checkpoint.load_state(root / f"stage_{stage:02d}", "state", load_model=False)
    sharded = engine._sharded_state()
    if sharded is not None:
        if load_optimizer_states and state.optimizer_groups:
            _, mine = sharded
            ranges = [tuple(g["shard"]) for g in mine["groups"]]
            engine.optimizer.load_sharded_state_dict(
                *state.optimizer_shard(ranges, mine["rank"], mine["world_size"])
            )
        else:
            engine._refresh_master_from_weights()
    if load_lr_scheduler_states and engine.lr_scheduler is not None and state.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(state.lr_scheduler)
    engine._load_counters(state.counters)
    return str(root), state.client_state


def _import_deepspeed_layers(
    engine: Any, root: Path, *, strict: bool, load_optimizer_states: bool
) -> tuple[str, dict]:
    """A DeepSpeed pipeline checkpoint: each layer's weights from DeepSpeed's ``layer_XX-model_states.pt``
    (read with ds_checkpoint's restricted unpickler), at any pipeline degree. DeepSpeed's optimizer files
    are not imported: that is refused unless ``load_optimizer_states=False``."""
    module, grid = engine.module, engine.grid
    if load_optimizer_states:
        raise PipelineCheckpointError(
            f"{root} is a DeepSpeed pipeline checkpoint: ds imports its per-layer weights, not its optimizer "
            "state; load it with load_checkpoint(..., load_optimizer_states=False)"
        )
    for idx, layer in _stateful_layers(module):
        files = sorted(root.glob(f"layer_{idx:02d}-*model_states.pt"))
        if files:
            layer.load_state_dict(ds_checkpoint.safe_torch_load(files[0]), strict=strict)
        elif layer.state_dict():
            raise PipelineCheckpointError(
                f"stage {grid.stage_id}: {module.layer_name(idx)} has no DeepSpeed weights file "
                f"layer_{idx:02d}-model_states.pt in {root}"
            )
    module.synchronize_tied_weights()
    if engine._sharded_state() is not None:
        engine._refresh_master_from_weights()
    return str(root), {}

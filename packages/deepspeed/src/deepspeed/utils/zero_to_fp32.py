"""DeepSpeed's ``deepspeed.utils.zero_to_fp32``: a full fp32 state dict from a ds checkpoint.

The functions read checkpoints ds wrote (at any ZeRO stage and world size) through
ds_checkpoint's ``fp32_state_dict``: parameters from the fp32 master shards, buffers from the model file.

``get_optim_files``/``get_model_state_file`` name DeepSpeed's pickled ``*_optim_states.pt`` and
``*_model_states.pt`` files, which Lightning's ``convert_zero_checkpoint_to_fp32_state_dict`` ``torch.load``s
for the ZeRO stage and its own client state. A ds checkpoint has no such files (it is safetensors and JSON),
so for one they return a DeepSpeed-shaped view written on first use into a temporary folder (removed at
exit; the checkpoint itself is not touched): the optimizer file holds ``{"optimizer_state_dict":
{"zero_stage": N}}``, the model file the full weights under ``module`` and the client state at top level,
as DeepSpeed lays them out. Both hold only tensors and plain values (``torch.load(weights_only=True)``
reads them). A folder that is not a ds checkpoint is an error naming what was looked for.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from ds_checkpoint import fp32_state_dict, load_state
from ds_engine._missing import FeatureNotAvailableError

__all__ = [
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
    "get_model_state_file",
    "get_optim_files",
    "load_state_dict_from_zero_checkpoint",
]


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str | os.PathLike,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
    lazy_mode: bool = False,
) -> dict[str, torch.Tensor]:
    """The checkpoint's consolidated fp32 weights (``tag`` None: the one named by ``latest``)."""
    if exclude_frozen_parameters or lazy_mode:
        flag = "exclude_frozen_parameters" if exclude_frozen_parameters else "lazy_mode"
        raise FeatureNotAvailableError(
            f"get_fp32_state_dict_from_zero_checkpoint({flag}=True) is not available in ds; call it without "
            f"{flag} (ds returns every tensor, materialised)"
        )
    return fp32_state_dict(checkpoint_dir, tag)


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    max_shard_size: str | int = "5GB",
    safe_serialization: bool = False,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
) -> dict[str, Any]:
    """Write the fp32 weights into ``output_dir`` as ``pytorch_model.bin`` or, with
    ``safe_serialization``, ``model.safetensors`` (one file: ``max_shard_size`` is not applied)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if safe_serialization:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    else:
        torch.save(state, out / "pytorch_model.bin")
    return state


def load_state_dict_from_zero_checkpoint(
    model: torch.nn.Module, checkpoint_dir: str | os.PathLike, tag: str | None = None
) -> torch.nn.Module:
    """Move ``model`` to CPU and load the checkpoint's fp32 weights into it; returns ``model``."""
    model = model.cpu()
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag), strict=False)
    return model


_MODEL_VIEW = "mp_rank_00_model_states.pt"
_OPTIM_VIEW = "zero_pp_rank_0_mp_rank_00_optim_states.pt"
_views: dict[Path, Path] = {}


def _deepspeed_view(checkpoint_dir: str | os.PathLike) -> Path:
    """The folder holding the DeepSpeed-shaped view of the ds checkpoint in ``checkpoint_dir`` (a tag folder)."""
    tag_dir = Path(checkpoint_dir).resolve()
    if tag_dir in _views:
        return _views[tag_dir]
    if not (tag_dir / "meta.json").is_file():
        raise FeatureNotAvailableError(
            f"{tag_dir} is not a ds checkpoint (no meta.json): ds reads its own checkpoints here, not "
            "DeepSpeed's *_model_states.pt / *_optim_states.pt files. Point it at the tag folder ds saved "
            "(the one named by `latest`), or convert DeepSpeed checkpoints with `python -m ds_checkpoint`"
        )
    state = load_state(tag_dir.parent, tag_dir.name)
    if state is None:
        raise FileNotFoundError(f"no ds checkpoint in {tag_dir}")
    zero = (state.config or {}).get("zero_optimization") or {}
    stage = int(zero.get("stage", 0)) if isinstance(zero, dict) else 0
    view = Path(tempfile.mkdtemp(prefix="ds-deepspeed-view-"))
    atexit.register(shutil.rmtree, view, True)
    torch.save({"optimizer_state_dict": {"zero_stage": stage}}, view / _OPTIM_VIEW)
    model = {
        **state.client_state,
        "module": state.model_state or {},
        "dp_world_size": state.world_size,
        "mp_world_size": 1,
        "global_steps": state.counters.get("global_steps"),
        "skipped_steps": state.counters.get("skipped_steps"),
    }
    torch.save(model, view / _MODEL_VIEW)
    _views[tag_dir] = view
    return view


def get_optim_files(checkpoint_dir: str | os.PathLike) -> list[str]:
    """DeepSpeed's optimizer files of a checkpoint tag folder: for a ds checkpoint, the one file of its
    DeepSpeed-shaped view (``{"optimizer_state_dict": {"zero_stage": N}}``; the state itself stays sharded
    in the checkpoint)."""
    return [str(_deepspeed_view(checkpoint_dir) / _OPTIM_VIEW)]


def get_model_state_file(checkpoint_dir: str | os.PathLike, zero_stage: int) -> str:
    """DeepSpeed's model-states file of a checkpoint tag folder: for a ds checkpoint, its view's (the full
    weights under ``module`` and the client state, e.g. Lightning's, at top level)."""
    del zero_stage  # one view serves every stage
    return str(_deepspeed_view(checkpoint_dir) / _MODEL_VIEW)

"""DeepSpeed's ``deepspeed.utils.zero_to_fp32``: a full fp32 state dict from a ds checkpoint.

The functions read checkpoints ds wrote (at any ZeRO stage and world size) through
ds_checkpoint's ``fp32_state_dict``: parameters from the fp32 master shards, buffers from the model file.
DeepSpeed's own checkpoint files are a different format: ``get_model_state_file``/``get_optim_files``
(Lightning's converter reads them) fail naming that.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from ds_checkpoint import fp32_state_dict
from ds_engine._missing import FeatureNotAvailableError, missing_function

__all__ = [
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
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


_FORMAT = "reading DeepSpeed's own checkpoint files (mp_rank_*_model_states.pt, *_optim_states.pt)"
_INSTEAD = "ds checkpoints are read with get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)."
get_model_state_file = missing_function(__name__, "get_model_state_file", _FORMAT, _INSTEAD)
get_optim_files = missing_function(__name__, "get_optim_files", _FORMAT, _INSTEAD)

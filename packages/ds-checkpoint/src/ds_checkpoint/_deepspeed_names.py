"""The file names DeepSpeed gives a checkpoint's pieces (``deepspeed.checkpoint.utils``' helpers).

ds writes its own format (``ds_checkpoint._save``); these names are what DeepSpeed writes, for code that
builds or looks for DeepSpeed's files (and for ``_deepspeed_import``, which reads them).
"""

from __future__ import annotations

import os

__all__ = ["layer_ckpt_name_for_rank", "model_ckpt_name_for_rank", "zero_ckpt_name_for_rank"]


def model_ckpt_name_for_rank(base_folder: str, mp_rank_str: str) -> str:
    """``<base_folder>/mp_rank_<mp_rank_str>_model_states.pt``."""
    return os.path.join(base_folder, f"mp_rank_{mp_rank_str}_model_states.pt")


def zero_ckpt_name_for_rank(base_folder: str, dp_rank: int, mp_rank: int) -> str:
    """``<base_folder>/zero_pp_rank_<dp>_mp_rank_<mp:02d>_optim_states.pt``."""
    return os.path.join(base_folder, f"zero_pp_rank_{dp_rank}_mp_rank_{mp_rank:02d}_optim_states.pt")


def layer_ckpt_name_for_rank(base_folder: str, layer_id: str, tp_rank: int) -> str:
    """``<base_folder>/<layer_id>-model_<tp:02d>_model_states.pt`` (a pipeline layer's file)."""
    return os.path.join(base_folder, f"{layer_id}-model_{tp_rank:02d}_model_states.pt")

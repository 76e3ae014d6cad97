"""DeepSpeed's ``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` and DeepSpeed's checkpoint file
names (``get_model_ckpt_name_for_rank`` and the rest), from ds_checkpoint."""

from ds_checkpoint import clone_tensors_for_torch_save
from ds_checkpoint import layer_ckpt_name_for_rank as get_layer_ckpt_name_for_rank
from ds_checkpoint import model_ckpt_name_for_rank as get_model_ckpt_name_for_rank
from ds_checkpoint import zero_ckpt_name_for_rank as get_zero_ckpt_name_for_rank

__all__ = [
    "clone_tensors_for_torch_save",
    "get_layer_ckpt_name_for_rank",
    "get_model_ckpt_name_for_rank",
    "get_zero_ckpt_name_for_rank",
]

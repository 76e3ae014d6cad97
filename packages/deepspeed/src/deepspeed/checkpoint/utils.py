"""DeepSpeed's ``deepspeed.checkpoint.utils``: ``clone_tensors_for_torch_save`` (ds_checkpoint's)."""

from ds_checkpoint import clone_tensors_for_torch_save

__all__ = ["clone_tensors_for_torch_save"]

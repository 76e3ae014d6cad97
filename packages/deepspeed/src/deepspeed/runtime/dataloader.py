"""DeepSpeed's ``deepspeed.runtime.dataloader``: ``RepeatingLoader`` (also ``deepspeed.utils.RepeatingLoader``)."""

from deepspeed.utils._utils import RepeatingLoader

__all__ = ["RepeatingLoader"]

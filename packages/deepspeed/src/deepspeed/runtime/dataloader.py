"""DeepSpeed's ``deepspeed.runtime.dataloader``: ``RepeatingLoader`` (also ``deepspeed.utils.RepeatingLoader``)."""

from ds_engine.utils import RepeatingLoader

__all__ = ["RepeatingLoader"]

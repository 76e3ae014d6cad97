"""DeepSpeed's ``deepspeed.sequence``: DeepSpeed-Ulysses sequence parallelism, mapped onto ``ds_tpsp.sequence``."""

from deepspeed.sequence import layer as layer

__all__ = ["layer"]

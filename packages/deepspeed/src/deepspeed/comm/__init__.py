"""DeepSpeed's ``deepspeed.comm`` (collectives, ``get_rank``, ``init_distributed``): the names of ``comm.comm``."""

from deepspeed._forward import forward
from deepspeed.comm import comm as _impl

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.comm`` (collectives, ``get_rank``, ``init_distributed``): forwards to ds_engine.comm."""

from ds_engine import comm as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

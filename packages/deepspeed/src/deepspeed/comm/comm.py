"""DeepSpeed's ``deepspeed.comm.comm``, the module ``deepspeed.comm`` re-exports: the same names
(ds_engine.comm), so ``deepspeed.comm.comm.all_reduce is deepspeed.comm.all_reduce``."""

from ds_engine import comm as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

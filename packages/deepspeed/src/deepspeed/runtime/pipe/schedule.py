"""DeepSpeed's ``deepspeed.runtime.pipe.schedule``: the schedules and their instructions, from ds-pipe."""

from ds_pipe import schedule as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

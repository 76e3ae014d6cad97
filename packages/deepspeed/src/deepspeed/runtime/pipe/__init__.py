"""DeepSpeed's ``deepspeed.runtime.pipe``: ds-pipe's pipeline (``ds_pipe``); its submodules map DeepSpeed's
module paths (``module``, ``topology``, ``schedule``, ``engine``) onto ds-pipe and ds-engine."""

import ds_pipe as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.runtime.pipe.module``: ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec`` and
``PipelineError`` from ds-pipe."""

from ds_pipe import _module as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

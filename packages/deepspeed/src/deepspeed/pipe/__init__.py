"""DeepSpeed's ``deepspeed.pipe``: ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec`` and the topologies are
ds-pipe's (``ds_pipe``); ``initialize()`` returns a pipeline engine for a PipelineModule."""

import ds_pipe as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

"""DeepSpeed's ``deepspeed.runtime.pipe.topology``: the topologies from ds-pipe; ``PipelineParallelGrid`` is
ds-pipe's grid (``PipelineGrid``), which ds-engine builds from the job's topology (``engine.grid``)."""

from ds_pipe import PipelineGrid as PipelineParallelGrid  # noqa: F401
from ds_pipe import _topology as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl, extra=["PipelineParallelGrid"])

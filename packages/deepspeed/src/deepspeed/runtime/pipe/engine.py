"""DeepSpeed's ``deepspeed.runtime.pipe.engine``: ``PipelineEngine`` is ds-engine's pipeline engine (what
``initialize()`` returns for a PipelineModule), so ``isinstance`` holds where DeepSpeed's does."""

from ds_engine import PipelineEngine

__all__ = ["PipelineEngine"]

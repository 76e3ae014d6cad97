"""DeepSpeed's ``deepspeed.ops.aio``: ``AsyncIOBuilder``, the op builder of NVMe offload, whose
``is_compatible()`` is False in ds and whose ``load()`` raises FeatureNotAvailableError naming NVMe offload."""

from ds_engine.ops.op_builder import AsyncIOBuilder

__all__ = ["AsyncIOBuilder"]

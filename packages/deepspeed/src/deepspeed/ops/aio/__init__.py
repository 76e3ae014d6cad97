"""DeepSpeed's ``deepspeed.ops.aio``: ``AsyncIOBuilder``, the op builder of NVMe offload; its ``load()``
gives DeepSpeed's ``aio_handle`` (and ``aio_read``, ``aio_write``, ``deepspeed_memcpy``) over ds's own
file I/O (``deepspeed.ops.aio._handle``)."""

from deepspeed.ops.op_builder import AsyncIOBuilder

__all__ = ["AsyncIOBuilder"]

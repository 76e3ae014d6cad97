"""Data-parallel gradient reduction: ZeRO stages 0, 1 and 2, buckets, overlap, CPU offload."""

__version__ = "0.1.0"
__all__ = ["__version__"]

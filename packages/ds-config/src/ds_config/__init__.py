"""pydantic v2 models of the whole DeepSpeed JSON config; batch-size derivation and validation."""

__version__ = "0.1.0"
__all__ = ["__version__"]

"""fp16 with dynamic/static loss scaling, bf16, and amp (apex when present, torch autocast otherwise)."""

__version__ = "0.1.0"
__all__ = ["__version__"]

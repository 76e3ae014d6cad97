"""Adam/AdamW, LAMB, OneBitAdam, a fast CPU Adam, and the DeepSpeed LR schedules."""

__version__ = "0.1.0"
__all__ = ["__version__"]

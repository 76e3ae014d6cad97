"""Activation checkpointing, and pickle-free training-state checkpoints that load at any world size."""

__version__ = "0.1.0"
__all__ = ["__version__"]

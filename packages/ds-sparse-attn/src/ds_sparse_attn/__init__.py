"""Block-sparse attention (fixed, BigBird, Longformer, variable layouts) on CPU and CUDA."""

__version__ = "0.1.0"
__all__ = ["__version__"]

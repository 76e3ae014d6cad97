"""initialize(), the engine and the training loop: assembles the ds-* packages."""

__version__ = "0.1.0"
__all__ = ["__version__"]

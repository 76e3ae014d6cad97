"""DeepSpeed's ``deepspeed.runtime``: a package of module paths, each mapped onto the ds implementation."""

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

"""DeepSpeed's ``deepspeed.runtime.activation_checkpointing``: its ``checkpointing`` module (``checkpoint``,
``configure``, ``is_configured``, ...) is ds-checkpoint's activation checkpointing."""

from deepspeed._forward import submodules

__all__ = ["checkpointing"]
__getattr__ = submodules(__name__)

"""DeepSpeed's ``deepspeed.launcher``: ``runner`` (the ``deepspeed`` command's parser), over ds-launch."""

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

"""DeepSpeed's ``deepspeed.launcher``: ``runner`` (the ``deepspeed`` command), ``multinode_runner``, ``launch``
and ``constants``, over ds-launch."""

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

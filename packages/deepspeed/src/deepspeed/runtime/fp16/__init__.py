"""DeepSpeed's ``deepspeed.runtime.fp16``: its submodules (``fused_optimizer``), mapped onto ds."""

from deepspeed._forward import submodules

__getattr__ = submodules(__name__)

"""DeepSpeed's ``deepspeed.ops.op_builder``: forwards to ds_engine.ops.op_builder (``CPUAdamBuilder()`` and the
rest, whose ``is_compatible()`` says whether ds provides the op's feature)."""

from ds_engine.ops import op_builder as _impl

from deepspeed._forward import forward

__all__, __getattr__, __dir__ = forward(__name__, _impl)

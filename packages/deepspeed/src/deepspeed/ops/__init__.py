"""DeepSpeed's ``deepspeed.ops``: one subpackage per DeepSpeed op module, each with its ds implementation.

``op_builder`` answers what DeepSpeed's op builders answer, for the ops ds has and has not.
"""

from deepspeed.ops import adagrad, adam, aio, lamb, lion, sparse_attention
from deepspeed.ops.op_builder import INSTALLED_OPS

# DeepSpeed's {op name: usable here}; in ds: whether ds provides the op's feature (deepspeed.ops.op_builder)
__compatible_ops__ = dict(INSTALLED_OPS)

__all__ = ["adagrad", "adam", "aio", "lamb", "lion", "sparse_attention"]

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

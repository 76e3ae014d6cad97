"""DeepSpeed's ``deepspeed.ops``: one subpackage per DeepSpeed op module, each forwarding to ds_engine.ops.

``op_builder`` answers what DeepSpeed's op builders answer, for the ops ds has and has not.
"""

from ds_engine.ops.op_builder import INSTALLED_OPS

from deepspeed.ops import adagrad, adam, aio, lamb, lion, sparse_attention

# DeepSpeed's {op name: usable here}; in ds: whether ds provides the op's feature (deepspeed.ops.op_builder)
__compatible_ops__ = dict(INSTALLED_OPS)

__all__ = ["adagrad", "adam", "aio", "lamb", "lion", "sparse_attention"]

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

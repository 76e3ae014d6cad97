"""DeepSpeed's ``deepspeed.ops``: one subpackage per DeepSpeed op module, each forwarding to ds_engine.ops.

``op_builder`` answers what DeepSpeed's op builders answer, for the ops ds has and has not.
"""

from deepspeed.ops import adagrad, adam, lamb, lion, sparse_attention

__all__ = ["adagrad", "adam", "lamb", "lion", "sparse_attention"]

from deepspeed._forward import submodules  # noqa: E402

__getattr__ = submodules(__name__)

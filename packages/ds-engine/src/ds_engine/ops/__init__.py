"""DeepSpeed's ``deepspeed.ops``: its optimizers and sparse attention, mapped onto ds-optim and ds-sparse-attn.

``adagrad`` and ``lion`` are DeepSpeed optimizers ds-optim does not have: their classes fail at
construction with FeatureNotAvailableError naming them.
"""

from ds_engine.ops import adagrad, adam, lamb, lion, op_builder, sparse_attention

__all__ = ["adagrad", "adam", "lamb", "lion", "op_builder", "sparse_attention"]

"""DeepSpeed's ``deepspeed.ops``: its optimizers and sparse attention, mapped onto ds-optim and ds-sparse-attn."""

from ds_engine.ops import adam, lamb, sparse_attention

__all__ = ["adam", "lamb", "sparse_attention"]

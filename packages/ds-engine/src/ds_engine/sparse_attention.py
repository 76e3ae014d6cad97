"""Build sparse attention from the config's ``sparse_attention`` section (ds-sparse-attn)."""

from __future__ import annotations

from typing import Any

import ds_sparse_attn
from ds_config import DSConfig


def sparse_self_attention(
    config: DSConfig, num_heads: int, *, seed: int = 0, **module_kwargs: Any
) -> ds_sparse_attn.SparseSelfAttention:
    """A ``SparseSelfAttention`` whose layout is the config's ``sparse_attention`` section.

    Raises ``ValueError`` when the config has no ``sparse_attention`` section.
    """
    if config.sparse_attention is None:
        raise ValueError('the config has no "sparse_attention" section; add one (e.g. {"mode": "fixed"})')
    layout = ds_sparse_attn.from_config(config.sparse_attention, num_heads, seed=seed)
    return ds_sparse_attn.SparseSelfAttention(layout, **module_kwargs)

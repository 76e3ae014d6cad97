"""Build a layout from ds_config's `sparse_attention` section in one call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._layouts import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)

# Which section keys each mode reads (DeepSpeed 0.14's get_sparse_*_config, plus `attention` for bigbird and
# bslongformer, which DeepSpeed's parser dropped although the classes take it; ds_config reads it too).
_MODE_KEYS: dict[str, tuple[type[SparsityConfig], tuple[str, ...]]] = {
    "dense": (DenseSparsityConfig, ("block",)),
    "fixed": (
        FixedSparsityConfig,
        (
            "block",
            "different_layout_per_head",
            "num_local_blocks",
            "num_global_blocks",
            "attention",
            "horizontal_global_attention",
            "num_different_global_patterns",
        ),
    ),
    "variable": (
        VariableSparsityConfig,
        (
            "block",
            "different_layout_per_head",
            "num_random_blocks",
            "local_window_blocks",
            "global_block_indices",
            "global_block_end_indices",
            "attention",
            "horizontal_global_attention",
        ),
    ),
    "bigbird": (
        BigBirdSparsityConfig,
        (
            "block",
            "different_layout_per_head",
            "num_random_blocks",
            "num_sliding_window_blocks",
            "num_global_blocks",
            "attention",
        ),
    ),
    "bslongformer": (
        BSLongformerSparsityConfig,
        (
            "block",
            "different_layout_per_head",
            "num_sliding_window_blocks",
            "global_block_indices",
            "global_block_end_indices",
            "attention",
        ),
    ),
}

# DeepSpeed's config parser defaults num_random_blocks to 0 for bigbird too (the class default is 1).
_SECTION_DEFAULTS: dict[str, Any] = {"num_random_blocks": 0}


def _read(section: Any, key: str) -> Any:
    if isinstance(section, Mapping):
        return section.get(key, _SECTION_DEFAULTS.get(key))
    return getattr(section, key, _SECTION_DEFAULTS.get(key))


def from_config(section: Any, num_heads: int, seed: int = 0) -> SparsityConfig:
    """The layout config described by a `sparse_attention` section.

    Args:
        section: ds_config's `SparseAttentionConfig` (or any object / mapping with the same keys).
        num_heads: attention heads of the layer (the config does not carry it).
        seed: seeds random blocks (variable, bigbird) so every rank and rerun agree.
    """
    mode = _read(section, "mode") or "fixed"
    if mode not in _MODE_KEYS:
        raise NotImplementedError(
            f"Given sparsity mode, {mode}, has not been implemented yet! "
            f"sparse_attention.mode must be one of {sorted(_MODE_KEYS)}."
        )
    cls, keys = _MODE_KEYS[mode]
    kwargs = {key: value for key in keys if (value := _read(section, key)) is not None}
    if mode in ("variable", "bigbird"):
        kwargs["seed"] = seed
    return cls(num_heads=num_heads, **kwargs)

"""Build a layout from ds_config's `sparse_attention` section in one call."""

from __future__ import annotations

from ds_config import (
    BigBirdSparseAttentionConfig,
    BSLongformerSparseAttentionConfig,
    DenseSparseAttentionConfig,
    FixedSparseAttentionConfig,
    SparseAttentionModeConfig,
    VariableSparseAttentionConfig,
)

from ._layouts import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    SparsityConfig,
    VariableSparsityConfig,
)


def from_config(section: SparseAttentionModeConfig, num_heads: int, seed: int = 0) -> SparsityConfig:
    """The layout config described by a `sparse_attention` section.

    Each mode reads the keys DeepSpeed 0.14's get_sparse_*_config read, plus `attention` for bigbird and
    bslongformer (DeepSpeed's parser dropped it although the classes take it). ds_config's section
    default of `num_random_blocks` is 0 for bigbird too, as in DeepSpeed's parser (the class default is 1).

    Args:
        section: `DSConfig.sparse_attention`: one of ds_config's five per-mode models.
        num_heads: attention heads of the layer (the config does not carry it).
        seed: seeds random blocks (variable, bigbird) so every rank and rerun agree.
    """
    if not isinstance(section, SparseAttentionModeConfig):
        raise TypeError(
            "from_config takes ds_config's sparse_attention section (DSConfig.sparse_attention, one model per "
            f"mode), got {type(section).__name__}"
        )
    common = {"num_heads": num_heads, "block": section.block}
    if isinstance(section, DenseSparseAttentionConfig):
        return DenseSparsityConfig(**common)
    common["different_layout_per_head"] = section.different_layout_per_head
    if isinstance(section, FixedSparseAttentionConfig):
        return FixedSparsityConfig(
            **common,
            num_local_blocks=section.num_local_blocks,
            num_global_blocks=section.num_global_blocks,
            attention=section.attention,
            horizontal_global_attention=section.horizontal_global_attention,
            num_different_global_patterns=section.num_different_global_patterns,
        )
    if isinstance(section, VariableSparseAttentionConfig):
        return VariableSparsityConfig(
            **common,
            num_random_blocks=section.num_random_blocks,
            local_window_blocks=section.local_window_blocks,
            global_block_indices=section.global_block_indices,
            global_block_end_indices=section.global_block_end_indices,
            attention=section.attention,
            horizontal_global_attention=section.horizontal_global_attention,
            seed=seed,
        )
    if isinstance(section, BigBirdSparseAttentionConfig):
        return BigBirdSparsityConfig(
            **common,
            num_random_blocks=section.num_random_blocks,
            num_sliding_window_blocks=section.num_sliding_window_blocks,
            num_global_blocks=section.num_global_blocks,
            attention=section.attention,
            seed=seed,
        )
    if isinstance(section, BSLongformerSparseAttentionConfig):
        return BSLongformerSparsityConfig(
            **common,
            num_sliding_window_blocks=section.num_sliding_window_blocks,
            global_block_indices=section.global_block_indices,
            global_block_end_indices=section.global_block_end_indices,
            attention=section.attention,
        )
    raise TypeError(f"sparse_attention section of unknown mode model {type(section).__name__}")

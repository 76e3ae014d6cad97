"""The DSConfig keys ds_sparse_attn's code reads (tools/checks/check_config_consumers.py reads this by AST).

``sparse_attention.mode`` selects the section model itself (ds_config's discriminated union), so
``from_config`` dispatches on the model's class.
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # from_config, over the five modes
    "sparse_attention.block",
    "sparse_attention.different_layout_per_head",
    "sparse_attention.num_local_blocks",
    "sparse_attention.num_global_blocks",
    "sparse_attention.attention",
    "sparse_attention.horizontal_global_attention",
    "sparse_attention.num_different_global_patterns",
    "sparse_attention.num_random_blocks",
    "sparse_attention.local_window_blocks",
    "sparse_attention.global_block_indices",
    "sparse_attention.global_block_end_indices",
    "sparse_attention.num_sliding_window_blocks",
)

"""ds_sparse_attn.CONFIG_FIELDS is exactly what from_config reads from the typed section, over every mode."""

import ds_sparse_attn
import pytest
from ds_config import SPARSE_ATTENTION_MODES, load_config
from ds_config.testing import ConfigReads


def test_config_fields_match_what_the_code_reads():
    reads = ConfigReads()
    for mode in SPARSE_ATTENTION_MODES:
        cfg = reads.wrap(load_config({"train_batch_size": 1, "sparse_attention": {"mode": mode}}))
        ds_sparse_attn.from_config(cfg.sparse_attention, num_heads=2)
    reads.check("ds_sparse_attn", ds_sparse_attn.CONFIG_FIELDS)


# Every key of every mode at a non-default value (several sets where keys exclude each other).
NON_DEFAULT = [
    {"mode": "dense", "block": 8},
    {
        "mode": "fixed",
        "block": 8,
        "different_layout_per_head": True,
        "num_local_blocks": 8,
        "num_global_blocks": 2,
        "horizontal_global_attention": True,
        "num_different_global_patterns": 2,
    },
    {"mode": "fixed", "attention": "unidirectional"},
    {
        "mode": "variable",
        "block": 8,
        "different_layout_per_head": True,
        "num_random_blocks": 1,
        "local_window_blocks": [2, 3],
        "global_block_indices": [1],
        "global_block_end_indices": [2],
        "attention": "unidirectional",
    },
    {"mode": "variable", "horizontal_global_attention": True},
    {
        "mode": "bigbird",
        "block": 8,
        "different_layout_per_head": True,
        "num_random_blocks": 2,
        "num_sliding_window_blocks": 5,
        "num_global_blocks": 2,
        "attention": "unidirectional",
    },
    {
        "mode": "bslongformer",
        "block": 8,
        "different_layout_per_head": True,
        "num_sliding_window_blocks": 5,
        "global_block_indices": [1],
        "global_block_end_indices": [2],
        "attention": "unidirectional",
    },
]


@pytest.mark.parametrize("section", NON_DEFAULT, ids=[str(s) for s in NON_DEFAULT])
def test_every_key_reaches_the_layout_config(section):
    """Fails when from_config drops a key: the layout config would then hold the class default."""
    cfg = load_config({"train_batch_size": 1, "sparse_attention": section})
    layout = ds_sparse_attn.from_config(cfg.sparse_attention, num_heads=4)
    default = ds_sparse_attn.from_config(
        load_config({"train_batch_size": 1, "sparse_attention": {"mode": section["mode"]}}).sparse_attention,
        num_heads=4,
    )
    for key, value in section.items():
        if key != "mode":
            assert getattr(layout, key) == value != getattr(default, key), key

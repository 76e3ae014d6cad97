"""ds_sparse_attn.CONFIG_FIELDS is exactly what from_config reads from the typed section, over every mode."""

import ds_sparse_attn
from ds_config import SPARSE_ATTENTION_MODES, load_config
from ds_config.testing import ConfigReads


def test_config_fields_match_what_the_code_reads():
    reads = ConfigReads()
    for mode in SPARSE_ATTENTION_MODES:
        cfg = reads.wrap(load_config({"train_batch_size": 1, "sparse_attention": {"mode": mode}}))
        ds_sparse_attn.from_config(cfg.sparse_attention, num_heads=2)
    reads.check("ds_sparse_attn", ds_sparse_attn.CONFIG_FIELDS)

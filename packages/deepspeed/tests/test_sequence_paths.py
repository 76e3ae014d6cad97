"""DeepSpeed's sequence-parallel names map onto ds_tpsp (its tests train them on real ranks)."""

from __future__ import annotations

import ds_tpsp.sequence


def test_distributed_attention_is_ds_tpsps() -> None:
    from deepspeed.sequence.layer import DistributedAttention, apply_rotary_pos_emb, single_all_to_all

    assert DistributedAttention is ds_tpsp.sequence.DistributedAttention
    assert single_all_to_all is ds_tpsp.sequence.single_all_to_all
    assert apply_rotary_pos_emb is ds_tpsp.sequence.layer.apply_rotary_pos_emb

"""DeepSpeed's ``deepspeed.sequence.layer``: ``DistributedAttention`` (Ulysses all-to-all attention) from ds_tpsp."""

from ds_tpsp.sequence import DistributedAttention, single_all_to_all
from ds_tpsp.sequence.layer import apply_rotary_pos_emb

__all__ = ["DistributedAttention", "apply_rotary_pos_emb", "single_all_to_all"]

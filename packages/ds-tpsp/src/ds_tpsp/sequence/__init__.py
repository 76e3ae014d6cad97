"""Sequence parallelism: DeepSpeed-Ulysses all-to-all attention over a sequence-parallel group given to it."""

from ds_tpsp.sequence._all_to_all import all_to_all_exchange, seq_all_to_all, single_all_to_all
from ds_tpsp.sequence._errors import SequenceParallelError, check_degree, check_divisible
from ds_tpsp.sequence.layer import DistributedAttention

__all__ = [
    "DistributedAttention",
    "SequenceParallelError",
    "all_to_all_exchange",
    "check_degree",
    "check_divisible",
    "seq_all_to_all",
    "single_all_to_all",
]

"""DeepSpeed's ``deepspeed.runtime.sequence_parallel.parallel_state_sp`` (the Ulysses mpu), over ds's one topology.

``initialize_sequence_parallel(sp)`` builds the job's topology with a sequence axis of ``sp`` consecutive ranks
(``ds_engine.topology``); the getters answer from it. Passed as ``mpu`` to ``deepspeed.initialize``, the engine
reduces and partitions over data x sequence, as DeepSpeed does.
"""

import torch.distributed as dist
from ds_engine.topology import build_topology, get_topology
from ds_tpsp.sequence import check_degree


def initialize_sequence_parallel(sequence_parallel_size: int) -> None:
    if sequence_parallel_size <= 1:  # DeepSpeed's own check
        raise ValueError(f"sequence_parallel_size must be greater than 1, got {sequence_parallel_size}")
    check_degree(dist.get_world_size(), sequence_parallel_size, "initialize_sequence_parallel")
    build_topology(sequence=sequence_parallel_size)


def get_sequence_parallel_group():
    return get_topology().group("sequence")


def get_sequence_parallel_world_size():
    return get_topology().size("sequence")


def get_sequence_parallel_rank():
    return get_topology().coord("sequence")


def get_sequence_data_parallel_group():
    return get_topology().group("data_sequence")


def get_sequence_data_parallel_world_size():
    return get_topology().size("data_sequence")


def get_sequence_data_parallel_rank():
    return get_topology().coord("data_sequence")


get_model_parallel_rank = get_sequence_parallel_rank
get_model_parallel_world_size = get_sequence_parallel_world_size
get_model_parallel_group = get_sequence_parallel_group

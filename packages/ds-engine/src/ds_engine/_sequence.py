"""Sequence parallelism (DeepSpeed-Ulysses) in the engine: the groups from the one topology, handed over as an mpu.

With ``sequence_parallel_size`` sp (the config key, or a DeepSpeed sequence-parallel mpu such as
``deepspeed.runtime.sequence_parallel.parallel_state_sp``), the job's topology gets a sequence axis of sp
consecutive ranks; the data-parallel size is world / sp (the batch math); ZeRO partitions, and the gradients are
reduced, over data x sequence. DeepSpeed 0.19.8 at ZeRO stages 0-2 sums the gradients over data x sequence and
divides by the data-parallel size only: ds averages over data x sequence (its reducers' one rule) and scales the
backward by sp, which is the same gradient. At stage 3, 0.19.8 averages over data x sequence (DeepSpeed changed
that in 0.20.2; transformers' Trainer compensates by the version it sees), so ds does not scale there.
"""

from __future__ import annotations

from typing import Any

from ds_config import DSConfig, read_source
from ds_tpsp.sequence import check_degree
from torch.distributed import ProcessGroup

from ds_engine._args import InitializeError
from ds_engine.topology import ParallelTopology, build_topology


def is_sequence_mpu(mpu: Any) -> bool:
    """A DeepSpeed sequence-parallel mpu (``parallel_state_sp``): sequence groups and no data-parallel getter."""
    return hasattr(mpu, "get_sequence_parallel_world_size") and not hasattr(mpu, "get_data_parallel_group")


def sequence_parallel_hint(source: Any, mpu: Any, world_size: int) -> int:
    """The degree to divide the world by for the batch math, read before the config is validated (the typed
    ``sequence_parallel_size`` is checked against it by :func:`sequence_parallel_size`)."""
    if mpu is not None:
        size = mpu.get_sequence_parallel_world_size()
    else:
        raw, _ = read_source(source)
        size = raw.get("sequence_parallel_size", 1) if isinstance(raw, dict) else 1
    if not isinstance(size, int) or isinstance(size, bool) or size <= 1:
        return 1  # ds_config's typed model names a bad value
    check_degree(world_size, size)  # before the batch math would blame the batch size
    return size


def sequence_parallel_size(cfg: DSConfig, mpu: Any, world_size: int) -> int:
    """The sequence-parallel degree the job asks for, from the config or the mpu (which must agree)."""
    size = cfg.sequence_parallel_size
    if is_sequence_mpu(mpu):
        from_mpu = mpu.get_sequence_parallel_world_size()
        if size not in (1, from_mpu):
            raise InitializeError(
                f"sequence_parallel_size is {size} in the config but the mpu's sequence-parallel group has "
                f"{from_mpu} ranks; make them equal (or leave the key out)"
            )
        size = from_mpu
    check_degree(world_size, size)
    return size


class SequenceParallelGrid:
    """What the engine uses as its mpu under sequence parallelism (the topology's groups, nothing built here)."""

    def __init__(self, topology: ParallelTopology) -> None:
        self.topology = topology

    # no model-parallel axis: the gradients are whole on every rank of a sequence group after the reduction
    # (DeepSpeed's ZeRO drops a sequence mpu's model-parallel group too); activation checkpointing sees 1 rank
    def get_model_parallel_group(self) -> None:
        return None

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0

    # ZeRO's group: data x sequence; the batch math's size: data
    def get_data_parallel_group(self) -> ProcessGroup:
        return self.topology.group("data_sequence")

    def get_data_parallel_world_size(self) -> int:
        return self.topology.size("data")

    def get_data_parallel_rank(self) -> int:
        return self.topology.coord("data")

    def get_sequence_parallel_group(self) -> ProcessGroup:
        return self.topology.group("sequence")

    def get_sequence_parallel_world_size(self) -> int:
        return self.topology.size("sequence")

    def get_sequence_parallel_rank(self) -> int:
        return self.topology.coord("sequence")

    def get_sequence_data_parallel_group(self) -> ProcessGroup:
        return self.topology.group("data_sequence")

    def get_sequence_data_parallel_world_size(self) -> int:
        return self.topology.size("data_sequence")

    def get_sequence_data_parallel_rank(self) -> int:
        return self.topology.coord("data_sequence")


def sequence_grid(size: int) -> SequenceParallelGrid:
    """The grid over the job's topology with a sequence axis of ``size`` (collective)."""
    return SequenceParallelGrid(build_topology(sequence=size))

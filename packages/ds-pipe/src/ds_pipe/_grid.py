"""The grid: this rank's place in the pipeline topology and the groups ds-engine made for it (DeepSpeed's
``PipelineParallelGrid`` names; it is what ``engine.grid`` and ``PipelineModule.mpu()`` return)."""

from __future__ import annotations

from typing import Any

from ds_pipe._topology import ProcessTopology

__all__ = ["PipelineGrid"]


class PipelineGrid:
    """Stage and data-parallel coordinates of ``global_rank`` in ``topology``, with the process groups along
    the pipe axis (``pipe_group``: this rank's pipeline, stage order), the data axis (``data_group``: the
    ranks holding the same stage) and the tensor axis (``model_group``, None without one)."""

    def __init__(
        self,
        topology: ProcessTopology,
        global_rank: int,
        *,
        pipe_group: Any,
        data_group: Any,
        model_group: Any = None,
    ) -> None:
        self._topo = topology
        self.global_rank = global_rank
        self.world_size = topology.world_size()
        self.data_parallel_size = max(topology.get_dim("data"), 1)
        self.pipe_parallel_size = max(topology.get_dim("pipe"), 1)
        self.model_parallel_size = max(topology.get_dim("model"), 1)
        self.slice_parallel_size = self.model_parallel_size
        coord = topology.get_coord(global_rank)
        self.stage_id = coord.pipe
        self.data_parallel_id = getattr(coord, "data", 0)
        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
        self.pp_group = next(g for g in topology.get_axis_comm_lists("pipe") if global_rank in g)
        self.dp_group = next(
            (g for g in topology.get_axis_comm_lists("data") if global_rank in g), [global_rank]
        )
        self.slice_group = next(
            (g for g in topology.get_axis_comm_lists("model") if global_rank in g), [global_rank]
        )
        self.pp_proc_group = pipe_group
        self.dp_proc_group = data_group
        self.slice_proc_group = model_group
        self.p2p_groups = [
            [g[i], g[(i + 1) % len(g)]]
            for r in range(self.world_size)
            for g in topology.get_axis_comm_lists("pipe")
            for i in range(len(g))
            if g[i] == r
        ]

    def get_stage_id(self) -> int:
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        """The global rank of stage ``stage_id`` with this rank's other coordinates (or those given)."""
        me = self._topo.get_coord(self.global_rank)
        return self._topo.get_rank(**me._replace(pipe=stage_id, **kwargs)._asdict())

    def topology(self) -> ProcessTopology:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    get_pipeline_model_parallel_rank = get_pipe_parallel_rank

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_pipe_parallel_group(self) -> Any:
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Any:
        return self.dp_proc_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.dp_group

    def get_model_parallel_rank(self) -> int:
        return self.slice_group.index(self.global_rank)

    def get_model_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    def get_model_parallel_group(self) -> Any:
        return self.slice_proc_group

    get_slice_parallel_rank = get_model_parallel_rank
    get_slice_parallel_world_size = get_model_parallel_world_size
    get_slice_parallel_group = get_model_parallel_group
    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

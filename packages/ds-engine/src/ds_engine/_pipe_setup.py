"""A ``PipelineModule`` joins the job's one topology: its grid's groups come from ``ds_engine.topology``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import ds_pipe
import torch
import torch.distributed as dist
from ds_config import DSConfig

from ds_engine._args import InitializeError
from ds_engine._missing import FeatureNotAvailableError
from ds_engine.topology import build_topology

__all__ = ["PipelineZeroError", "check_pipeline_config", "collective_timeout", "pipeline_grid"]


class PipelineZeroError(AssertionError):
    """ZeRO stage 2 or 3 with a pipeline: DeepSpeed refuses it with an AssertionError, and so does ds."""


def pipeline_grid(module: ds_pipe.PipelineModule, mpu: Any) -> ds_pipe.PipelineGrid:
    """Build the topology for the module's pipeline (collective), the grid from its groups, and the
    tied-weight groups; hand them to the module (which makes its tied copies equal)."""
    if mpu is not None:
        raise InitializeError(
            "initialize() was given both a PipelineModule and an mpu: the PipelineModule's topology is the "
            "model-parallel unit (engine.grid); leave mpu out"
        )
    layout = module.topology()
    if layout.get_dim("model") > 1:
        raise ds_pipe.PipelineError(
            f"a pipeline with tensor parallelism (a 'model' axis of {layout.get_dim('model')}) is not in ds: "
            "use PipeDataParallelTopology (pipeline x data parallelism)"
        )
    topo = build_topology(pipe=module.num_stages)
    rank = dist.get_rank()
    if topo.ranks("pipe") != next(g for g in layout.get_axis_comm_lists("pipe") if rank in g):
        raise ds_pipe.PipelineError(
            f"rank {rank}: the PipelineModule's topology lays out the pipeline as "
            f"{layout.get_axis_comm_lists('pipe')}, which is not the job's (pipe, data) layout"
        )
    grid = ds_pipe.PipelineGrid(layout, rank, pipe_group=topo.group("pipe"), data_group=topo.group("data"))
    module.attach_groups(grid, _tied_groups(module, grid))
    # every stage's own weights count towards the gradient norm reduced over the pipeline; a tied copy
    # counts on its first stage only (the precision and ZeRO wrappers count model_parallel parameters on
    # every rank of the norm's group and the others on its first rank)
    for p in module.parameters():
        if not p.ds_pipe_replicated:
            p.model_parallel = True
    return grid


def collective_timeout() -> timedelta | None:
    """The job's collective timeout: the world group's (``init_distributed(timeout=...)``; 30 minutes unless
    said), None where the backend does not tell. Groups made by ``new_group`` default to 30 minutes whatever
    the world's, so the pipeline bounds its waits (and its tied groups) by this one."""
    for device in ("cuda", "cpu"):
        try:
            return dist.group.WORLD._get_backend(torch.device(device)).options._timeout  # type: ignore[union-attr]
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def _tied_groups(module: ds_pipe.PipelineModule, grid: ds_pipe.PipelineGrid) -> dict[str, dict[str, Any]]:
    """One group per tied key and pipeline (the stages holding the key); every rank makes every group, in
    the same order (``new_group`` is collective)."""
    comms: dict[str, dict[str, Any]] = {}
    if grid.pipe_parallel_size == 1:
        return comms
    for key, stages in module.tied_keys().items():
        for dp in range(grid.data_parallel_size):
            ranks = [grid.topology().get_rank(pipe=s, data=dp) for s in stages]
            group = dist.new_group(ranks=ranks, timeout=collective_timeout())
            if grid.global_rank in ranks:
                comms[key] = {"key": key, "ranks": ranks, "group": group}
    return comms


def check_pipeline_config(cfg: DSConfig, module: ds_pipe.PipelineModule | None = None) -> None:
    """What a pipeline refuses: ZeRO 2 and 3 as DeepSpeed does; tied weights across stages with bf16's fp32
    gradient accumulation (its buffers take the gradients out of ``.grad`` before the tied sum could)."""
    if cfg.zero_optimization.stage >= 2:
        raise PipelineZeroError("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    if module is not None and module.tied_comms and cfg.bf16.enabled and cfg.bf16.grad_accum_dtype == "fp32":
        raise FeatureNotAvailableError(
            "tied weights across pipeline stages (TiedLayerSpec keys "
            f"{sorted(module.tied_comms)}) with bf16.grad_accum_dtype 'fp32' are not available in ds: the fp32 "
            "accumulation buffers take the gradients before the stages' tied sum; use grad_accum_dtype 'bf16' "
            "(the default)"
        )

"""The engine's DeepSpeed-named getters: what the config and the topology say, under DeepSpeed's names.

Scripts, trainers (Hugging Face, Lightning) and logging code call these on the engine. They only read;
everything that acts lives in ``_engine.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from ds_config import DSConfig
from ds_launch import Topology

from ds_engine.topology import get_topology


class ConfigGetters:
    """Mixed into ``DeepSpeedEngine``; expects ``config``, ``topology``, ``parts`` and ``optimizer``."""

    config: DSConfig
    topology: Topology
    parts: Any
    optimizer: Any

    # ------------------------------------------------------------------ precision
    def fp16_enabled(self) -> bool:
        return self.ds_config.fp16.enabled

    def bfloat16_enabled(self) -> bool:
        return self.ds_config.bf16.enabled

    def amp_enabled(self) -> bool:
        return self.ds_config.amp.enabled

    def dynamic_loss_scale(self) -> bool:
        return self.ds_config.fp16.enabled and self.ds_config.fp16.dynamic_loss_scale

    def get_data_types(self) -> tuple[torch.dtype, torch.dtype | None]:
        """(model dtype, gradient-accumulation dtype) as DeepSpeed reports them."""
        accum = (
            torch.float32
            if self.ds_config.bf16.enabled and self.ds_config.bf16.grad_accum_dtype == "fp32"
            else None
        )
        return self.parts.dtype, accum or self.parts.dtype

    # ------------------------------------------------------------------ ZeRO
    def zero_optimization(self) -> bool:
        return self.zero_optimization_stage() > 0

    def zero_optimization_stage(self) -> int:
        return self.ds_config.zero_optimization.stage

    def zero_optimization_partition_gradients(self) -> bool:
        return self.zero_optimization_stage() >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.zero_optimization_stage() >= 3

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        return self.ds_config.zero_optimization.stage3_gather_16bit_weights_on_model_save

    def zero_cpu_offload(self) -> bool:
        return self.ds_config.zero_optimization.offload_device == "cpu"

    zero_offload_optimizer = zero_cpu_offload

    def zero_allow_untested_optimizer(self) -> bool:
        return self.ds_config.zero_allow_untested_optimizer

    def zero_reduce_bucket_size(self) -> int:
        return self.ds_config.zero_optimization.reduce_bucket_size

    def zero_allgather_bucket_size(self) -> int:
        return self.ds_config.zero_optimization.allgather_bucket_size

    def zero_overlap_comm(self) -> bool:
        return self.ds_config.zero_optimization.overlap_comm

    def zero_contiguous_gradients(self) -> bool:
        return self.ds_config.zero_optimization.contiguous_gradients

    def zero_reduce_scatter(self) -> bool:
        return self.ds_config.zero_optimization.reduce_scatter

    # ------------------------------------------------------------------ gradients
    def gradient_clipping(self) -> float:
        return self.ds_config.gradient_clipping

    def postscale_gradients(self) -> bool:
        return not self.ds_config.prescale_gradients

    def gradient_predivide_factor(self) -> float:
        return self.ds_config.gradient_predivide_factor

    def sparse_gradients_enabled(self) -> bool:
        return self.ds_config.sparse_gradients

    # ------------------------------------------------------------------ optimizer and schedule
    def optimizer_name(self) -> str | None:
        """The config optimizer's type, or the client optimizer's class name."""
        if self.ds_config.optimizer is not None and not self.parts.client_optimizer:
            return self.ds_config.optimizer.type
        return type(self.parts.basic_optimizer).__name__

    def optimizer_params(self) -> dict[str, Any] | None:
        return self.ds_config.optimizer.params if self.ds_config.optimizer is not None else None

    def scheduler_name(self) -> str | None:
        return self.ds_config.scheduler.type if self.ds_config.scheduler is not None else None

    def scheduler_params(self) -> dict[str, Any] | None:
        return self.ds_config.scheduler.params if self.ds_config.scheduler is not None else None

    def get_lr(self) -> list[float]:
        """Each group's lr; empty for an engine built without an optimizer (as DeepSpeed's)."""
        return [group["lr"] for group in self._stepped_groups()]

    def get_mom(self) -> list[Any]:
        """Each group's momentum: ``betas`` for Adam-like optimizers, ``momentum`` for SGD-like ones."""
        return [group.get("betas", group.get("momentum")) for group in self._stepped_groups()]

    def _stepped_groups(self) -> list[dict[str, Any]]:
        return [] if self.parts.evaluation_only else self.optimizer.param_groups

    def get_type(self) -> list[str]:
        return [type(self.parts.basic_optimizer).__name__]

    # ------------------------------------------------------------------ logging and checkpoints
    def steps_per_print(self) -> int:
        return self.ds_config.steps_per_print

    def wall_clock_breakdown(self) -> bool:
        return self.ds_config.wall_clock_breakdown

    def checkpoint_tag_validation_enabled(self) -> bool:
        return self.ds_config.checkpoint.tag_validation != "Ignore"

    def checkpoint_tag_validation_fail(self) -> bool:
        return self.ds_config.checkpoint.tag_validation == "Fail"

    def elasticity_enabled(self) -> bool:
        return self.ds_config.elasticity.enabled

    # ------------------------------------------------------------------ topology
    @property
    def local_rank(self) -> int:
        return self.topology.local_rank

    @property
    def global_rank(self) -> int:
        return self.topology.rank

    @property
    def device(self) -> torch.device:
        return self.topology.device

    @property
    def world_size(self) -> int:
        """The data-parallel world size (DeepSpeed's ``engine.world_size`` is the same)."""
        return self.parts.dp_world_size

    @property
    def dp_world_size(self) -> int:
        return self.parts.dp_world_size

    @property
    def dp_rank(self) -> int:
        """This rank's index in the data-parallel group."""
        dist = torch.distributed
        return dist.get_rank(self.parts.dp_group) if dist.is_available() and dist.is_initialized() else 0

    @property
    def mp_world_size(self) -> int:
        return self.topology.world_size // self.parts.dp_world_size

    # ------------------------------------------------------------------ tensor parallelism (AutoTP)
    def autotp_size(self) -> int:
        return self.ds_config.tensor_parallel.autotp_size

    def tensor_parallel_config(self) -> Any:
        """The ``tensor_parallel`` section (ds_config's typed model; DeepSpeed returns its own)."""
        return self.ds_config.tensor_parallel

    # ------------------------------------------------------------------ sequence parallelism (Ulysses)
    @property
    def sequence_parallel_size(self) -> int:
        return self.ds_config.sequence_parallel_size

    def get_sequence_parallel_group(self) -> Any:
        """The sequence-parallel group (the topology's ``sequence`` axis)."""
        return get_topology().group("sequence")

    @property
    def seq_parallel_group(self) -> Any:
        return self.get_sequence_parallel_group()

    @property
    def seq_data_parallel_group(self) -> Any:
        """ZeRO's group: data x sequence (the data-parallel group without sequence parallelism)."""
        return self.data_parallel_group

    @property
    def seq_dp_world_size(self) -> int:
        return self.parts.dp_world_size * self.sequence_parallel_size

    @property
    def data_parallel_group(self) -> Any:
        return self.parts.dp_group if self.parts.dp_group is not None else torch.distributed.group.WORLD

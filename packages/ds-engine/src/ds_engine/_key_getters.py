"""DeepSpeed's per-key engine getters (``engine.zero_sub_group_size()``, ``engine.initial_dynamic_scale()``...).

Each reads one value of ds-config's typed model under DeepSpeed 0.19.8's method name and returns what
DeepSpeed's returns (compared in packages/deepspeed/tests/test_engine_key_getters.py with values recorded
from DeepSpeed by tools/fixtures/make_deepspeed_behaviour_fixtures.py). Only reads, except
``set_train_micro_batch_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from ds_config import BatchSizes, DSConfig, derive_batch_sizes


class KeyGetters:
    """Mixed into ``DeepSpeedEngine``; expects ``ds_config``, ``dp_world_size``, ``dp_rank`` and ``_set_batch_sizes``."""

    ds_config: DSConfig
    dp_world_size: int
    dp_rank: int
    _set_batch_sizes: Callable[[BatchSizes], None]  # the engine's one setter of the batch triple (_engine.py)

    # ------------------------------------------------------------------ ZeRO
    def zero_sub_group_size(self) -> int:
        return self.ds_config.zero_optimization.sub_group_size

    def zero_prefetch_bucket_size(self) -> int:
        return self.ds_config.zero_optimization.stage3_prefetch_bucket_size

    def zero_max_live_parameters(self) -> int:
        return self.ds_config.zero_optimization.stage3_max_live_parameters

    def zero_max_reuse_distance(self) -> int:
        return self.ds_config.zero_optimization.stage3_max_reuse_distance

    def zero_param_persistence_threshold(self) -> int:
        return self.ds_config.zero_optimization.stage3_param_persistence_threshold

    def zero_model_persistence_threshold(self) -> int:
        return self.ds_config.zero_optimization.stage3_model_persistence_threshold

    def zero_hpz_partition_size(self) -> int:
        return self.ds_config.zero_optimization.zero_hpz_partition_size

    def zero_quantized_weights(self) -> bool:
        return self.ds_config.zero_optimization.zero_quantized_weights

    def zero_quantized_nontrainable_weights(self) -> bool:
        return self.ds_config.zero_optimization.zero_quantized_nontrainable_weights

    def zero_quantized_gradients(self) -> bool:
        return self.ds_config.zero_optimization.zero_quantized_gradients

    def is_first_weights_partition_group(self) -> bool:
        return self.ds_config.zero_optimization.stage >= 3

    def zero_allgather_partitions(self) -> bool:
        return self.ds_config.zero_optimization.allgather_partitions

    def zero_round_robin_gradients(self) -> bool:
        return self.ds_config.zero_optimization.round_robin_gradients

    def zero_load_from_fp32_weights(self) -> bool:
        return self.ds_config.zero_optimization.load_from_fp32_weights

    def zero_elastic_checkpoint(self) -> bool:
        return self.ds_config.zero_optimization.elastic_checkpoint

    def zero_ignore_unused_parameters(self) -> bool:
        return self.ds_config.zero_optimization.ignore_unused_parameters

    def zero_offload_param(self) -> Any:
        """The ``offload_param`` section (ds-config's model), or None without one, as DeepSpeed's."""
        return self.ds_config.zero_optimization.offload_param

    def zero_use_cpu_optimizer(self) -> bool:
        """True when the optimizer state is offloaded (cpu or nvme)."""
        return self.ds_config.zero_optimization.offload_device in ("cpu", "nvme")

    def zero_nvme_offload_optimizer(self) -> bool:
        return self.ds_config.zero_optimization.offload_device == "nvme"

    def zero_partial_offload(self) -> float:
        return getattr(self.ds_config.zero_optimization.offload_optimizer, "ratio", 1.0)

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self.ds_config.zero_force_ds_cpu_optimizer

    def aio_config(self) -> dict[str, Any]:
        """The ``aio`` section as a dict (DeepSpeed's is a dict too)."""
        return self.ds_config.aio.model_dump()

    # ------------------------------------------------------------------ precision
    def initial_dynamic_scale(self) -> int:
        return 2**self.ds_config.fp16.initial_scale_power

    def dynamic_loss_scale_args(self) -> dict[str, Any]:
        """DeepSpeed's dynamic loss-scaler arguments, under its key names."""
        fp16 = self.ds_config.fp16
        return {
            "init_scale": 2**fp16.initial_scale_power,
            "scale_window": fp16.loss_scale_window,
            "delayed_shift": fp16.hysteresis,
            "consecutive_hysteresis": fp16.consecutive_hysteresis,
            "min_scale": fp16.min_loss_scale,
        }

    def fp16_auto_cast(self) -> bool:
        return self.ds_config.fp16.auto_cast

    def fp16_master_weights_and_gradients(self) -> bool:
        return self.ds_config.fp16.fp16_master_weights_and_grads

    def bf16_master_weights_and_gradients(self) -> bool:
        return self.ds_config.bf16.bf16_master_weights_and_grads

    def bf16_optimizer_states(self) -> bool:
        return self.ds_config.bf16.bf16_optimizer_states

    # ------------------------------------------------------------------ communication
    @property
    def communication_data_type(self) -> torch.dtype:
        """The dtype data-parallel gradients are reduced in, as DeepSpeed's property reports it: fp16 with
        fp16, bf16 with bf16, else fp32; float32 with ``fp32_allreduce``, ds's key for fp32 reductions
        (ds-config refuses DeepSpeed's ``communication_data_type`` key, naming that one)."""
        c = self.ds_config
        if c.fp32_allreduce:
            return torch.float32
        if c.fp16.enabled:
            return torch.float16
        if c.bf16.enabled:
            return torch.bfloat16
        return torch.float32

    # ------------------------------------------------------------------ data, batch, ranks
    def dataloader_drop_last(self) -> bool:
        return self.ds_config.dataloader_drop_last

    def memory_breakdown(self) -> bool:
        return self.ds_config.memory_breakdown

    def get_batch_info(self) -> tuple[int, int, int]:
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        c = self.ds_config
        return c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """Change the micro batch, keeping gradient accumulation: the train batch follows, as DeepSpeed."""
        self._set_batch_sizes(derive_batch_sizes(None, micro_batch_size, self.ds_config.gradient_accumulation_steps,
                                                 self.dp_world_size, "the engine's data-parallel group"))  # fmt: skip

    def get_data_parallel_rank(self) -> int:
        return self.dp_rank

    def get_model_parallel_rank(self) -> int:
        return 0  # the engine trains data parallel: every model-parallel group is this rank alone

    def get_tensor_parallel_rank(self) -> int:
        return 0

    @staticmethod
    def is_map_style_dataset(obj: Any) -> bool:
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj: Any) -> bool:
        return isinstance(obj, torch.utils.data.IterableDataset)

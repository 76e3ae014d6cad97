"""DeepSpeed's ``deepspeed.runtime.config``: ``DeepSpeedConfig``, the parsed config, over ds_config.

``DeepSpeedConfig(config, mpu=None)`` validates with :func:`ds_config.load_config` (every problem at once,
in one ``ConfigError``) for the data-parallel world size DeepSpeed would use (``mpu``'s, else the
initialised world, else 1), and exposes DeepSpeed's attribute names for what code reads: the batch
triple, ``zero_config``/``zero_optimization_stage``/``zero_enabled``, ``float16_config``/``bfloat16_config``,
``optimizer_name``/``optimizer_params``, ``scheduler_name``/``scheduler_params``, ``gradient_clipping`` and
the rest below. ``ds_config`` is ds's typed model, for everything else.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import torch.distributed as dist
from ds_config import DSConfig, load_config

__all__ = ["DeepSpeedConfig", "DeepSpeedConfigError"]

# DeepSpeed lower-cases the names of its own optimizers; torch names are kept as written
_DEEPSPEED_OPTIMIZERS = {
    "adam",
    "adamw",
    "lamb",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
    "adagrad",
    "lion",
}


class DeepSpeedConfigError(Exception):
    """DeepSpeed's name for a config it cannot use (ds raises ds_config.ConfigError, with every problem)."""


def _world(mpu: Any) -> tuple[int, str]:
    if mpu is not None:
        return mpu.get_data_parallel_world_size(), "mpu.get_data_parallel_world_size()"
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), "torch.distributed world size"
    return 1, "no process group: a world of 1"


def _raw(config: Any) -> dict[str, Any]:
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)) and os.path.exists(config):
        with open(config) as f:
            return json.load(f)
    return {}  # base64: load_config decodes it; _param_dict is filled from the model below


class DeepSpeedConfig:
    """The parsed DeepSpeed config, with DeepSpeed's attribute names (see the module docstring)."""

    def __init__(self, config: str | dict[str, Any], mpu: Any = None, mesh_device: Any = None) -> None:
        world_size, source = _world(mpu)
        self.ds_config: DSConfig = load_config(config, world_size=world_size, world_size_source=source)
        cfg = self.ds_config
        self._param_dict = _raw(config) or cfg.model_dump(mode="json", exclude_unset=True)
        self.world_size = world_size
        self.global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.train_batch_size = cfg.batch.train_batch_size
        self.train_micro_batch_size_per_gpu = cfg.batch.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = cfg.batch.gradient_accumulation_steps
        self.zero_config = cfg.zero_optimization
        self.zero_optimization_stage = cfg.zero_optimization.stage
        self.zero_enabled = self.zero_optimization_stage > 0
        self.zero_allow_untested_optimizer = cfg.zero_allow_untested_optimizer
        self.zero_force_ds_cpu_optimizer = cfg.zero_force_ds_cpu_optimizer
        self.float16_config = cfg.fp16
        self.bfloat16_config = cfg.bf16
        self.activation_checkpointing_config = cfg.activation_checkpointing
        self.checkpoint_config = cfg.checkpoint
        self.gradient_clipping = cfg.gradient_clipping
        self.prescale_gradients = cfg.prescale_gradients
        self.gradient_predivide_factor = cfg.gradient_predivide_factor
        self.steps_per_print = cfg.steps_per_print
        self.wall_clock_breakdown = cfg.wall_clock_breakdown
        self.dump_state = cfg.dump_state
        self.memory_breakdown = cfg.memory_breakdown
        self.dataloader_drop_last = cfg.dataloader_drop_last
        opt, sched = cfg.optimizer, cfg.scheduler
        name = opt.type if opt is not None else None
        self.optimizer_name = name.lower() if name and name.lower() in _DEEPSPEED_OPTIMIZERS else name
        self.optimizer_params = dict(opt.params) if opt is not None else None
        self.scheduler_name = sched.type if sched is not None else None
        self.scheduler_params = dict(sched.params) if sched is not None else None

    def print(self, name: str) -> None:
        """Log the whole config as JSON under ``name`` (DeepSpeed's ``print``)."""
        from deepspeed.utils.logging import logger

        logger.info(
            "%s:\n%s", name, json.dumps(self.ds_config.model_dump(mode="json"), indent=2, default=str)
        )

"""DeepSpeed's ``deepspeed.runtime.config``: ``DeepSpeedConfig``, the ``get_*`` readers and the key names.

One definition of the config: everything here reads ds_config's models. ``DeepSpeedConfig(config, mpu=None,
mesh_device=None)`` takes a dict, a path to a JSON or hjson file, or base64 JSON (as DeepSpeed does),
applies DeepSpeed 0.19.8's defaults where they differ from ds's own (:func:`deepspeed_defaults`, the same
ones ``deepspeed.initialize`` applies), validates with :func:`ds_config.load_config` (every problem at
once, in one ``ConfigError``) for the data-parallel world size DeepSpeed would use, and exposes DeepSpeed's
attribute names: the batch triple, ``zero_config`` (a :class:`DeepSpeedZeroConfig`, read by DeepSpeed's
field names and the JSON keys), ``float16_config``/``bfloat16_config``, ``gradient_clipping``,
``gradient_allreduce_op``, ``pipeline`` and the rest. ``ds_config`` is ds's typed model.
"""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist
from ds_config import ConfigError, DSConfig, load_config

from deepspeed.runtime._config_source import DEEPSPEED_DEFAULTS as DEEPSPEED_DEFAULTS
from deepspeed.runtime._config_source import deepspeed_defaults, load_param_dict
from deepspeed.runtime._views import DeepSpeedBF16Config, DeepSpeedZeroConfig, view
from deepspeed.runtime.config_utils import (
    DeepSpeedConfigModel,  # noqa: F401 - DeepSpeed re-exports it here
    ScientificNotationEncoder,
    dict_raise_error_on_duplicate_keys,  # noqa: F401 - DeepSpeed re-exports it here
    get_scalar_param,
)
from deepspeed.runtime.constants import *  # noqa: F403 - DeepSpeed's module re-exports its key names
from deepspeed.runtime.constants import __all__ as _constants
from deepspeed.runtime.precision_config import get_bfloat16_config as get_bfloat16_config
from deepspeed.runtime.precision_config import get_float16_config
from deepspeed.runtime.zero.config import ZeroStageEnum as ZeroStageEnum
from deepspeed.runtime.zero.config import get_zero_config as get_zero_config

ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
# DeepSpeed lower-cases the names of its own optimizers; torch names are kept as written
DEEPSPEED_OPTIMIZERS = [
    ADAGRAD_OPTIMIZER,
    ADAM_OPTIMIZER,
    ADAMW_OPTIMIZER,
    LAMB_OPTIMIZER,
    MUADAM_OPTIMIZER,
    MUADAMW_OPTIMIZER,
    MUSGD_OPTIMIZER,
    LION_OPTIMIZER,
    MUON_OPTIMIZER,
]
TORCH_ADAM_PARAM = "torch_adam"
ADAM_W_MODE = "adam_w_mode"
ADAM_W_MODE_DEFAULT = True

# DeepSpeed's pipeline section defaults (its pipeline engine reads them; ds_config's PipelineConfig is typed)
PIPELINE_DEFAULTS = {
    "stages": "auto",
    "partition": "best",
    "seed_layers": False,
    "activation_checkpoint_interval": 0,
    "pipe_partitioned": True,
    "grad_partitioned": True,
}


# DeepSpeed's class for a config it cannot use is ds_config's ConfigError (every problem at once), so that
# ``except deepspeed.DeepSpeedConfigError`` catches what ds raises (an unknown checkpoint.tag_validation, ...)
DeepSpeedConfigError = ConfigError


def _world(mpu: Any, mesh_device: Any) -> tuple[int, str]:
    if mpu is not None:
        return mpu.get_data_parallel_world_size(), "mpu.get_data_parallel_world_size()"
    if not (dist.is_available() and dist.is_initialized()):
        return 1, "no process group: a world of 1"
    if mesh_device is not None:
        group = mesh_device.get_group(mesh_dim="data_parallel")
        return dist.get_world_size(group), "the mesh's data_parallel dimension"
    return dist.get_world_size(), "torch.distributed world size"


def _section(param_dict: dict[str, Any], key: str) -> Any:
    """ds_config's validated value of top-level ``key`` of ``param_dict``, with DeepSpeed's defaults."""
    raw = {"train_batch_size": 1}
    if key in param_dict:
        raw[key] = param_dict[key]
    return getattr(load_config(deepspeed_defaults(raw)), key)


class DeepSpeedConfig:
    """The parsed DeepSpeed config, with DeepSpeed's attribute names (see the module docstring)."""

    def __init__(self, config: str | dict[str, Any], mpu: Any = None, mesh_device: Any = None) -> None:
        self._param_dict = load_param_dict(config)
        world_size, source = _world(mpu, mesh_device)
        self.ds_config: DSConfig = load_config(
            deepspeed_defaults(self._param_dict), world_size=world_size, world_size_source=source
        )
        cfg = self.ds_config
        self.world_size = world_size
        self.global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.train_batch_size = cfg.batch.train_batch_size
        self.train_micro_batch_size_per_gpu = cfg.batch.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = cfg.batch.gradient_accumulation_steps
        self.zero_config = view(cfg.zero_optimization, DeepSpeedZeroConfig)
        self.zero_optimization_stage = cfg.zero_optimization.stage
        self.zero_enabled = self.zero_optimization_stage > 0
        self.zero_allow_untested_optimizer = cfg.zero_allow_untested_optimizer
        self.zero_force_ds_cpu_optimizer = cfg.zero_force_ds_cpu_optimizer
        # DeepSpeed's fp16 defaults hold with or without an fp16 section (the engine needs them only with one)
        self.float16_config = get_float16_config(self._param_dict)
        self.bfloat16_config = view(cfg.bf16, DeepSpeedBF16Config)
        self.activation_checkpointing_config = cfg.activation_checkpointing
        self.checkpoint_config = cfg.checkpoint
        self.gradient_clipping = cfg.gradient_clipping
        self.gradient_allreduce_op = cfg.gradient_allreduce_op
        self.prescale_gradients = cfg.prescale_gradients
        self.gradient_predivide_factor = cfg.gradient_predivide_factor
        self.steps_per_print = cfg.steps_per_print
        self.wall_clock_breakdown = cfg.wall_clock_breakdown
        self.dump_state = cfg.dump_state
        self.memory_breakdown = cfg.memory_breakdown
        self.disable_allgather = cfg.disable_allgather
        self.dataloader_drop_last = cfg.dataloader_drop_last
        self.pipeline = {**PIPELINE_DEFAULTS, **cfg.pipeline.model_dump(exclude_unset=True)}
        self.checkpoint_tag_validation_enabled = cfg.checkpoint.tag_validation != "Ignore"
        self.checkpoint_tag_validation_fail = cfg.checkpoint.tag_validation == "Fail"
        # DeepSpeed keys ds does not have, at the value that says what ds does
        self.load_universal_checkpoint = False
        self.use_node_local_storage = False
        self.communication_data_type = None  # the gradients' own dtype (fp32_allreduce aside)
        self.grad_accum_dtype = (
            cfg.data_types.grad_accum_dtype
        )  # data_types (its effect: bf16.grad_accum_dtype)
        name = get_optimizer_name(self._param_dict)
        self.optimizer_name = name.lower() if name and name.lower() in DEEPSPEED_OPTIMIZERS else name
        self.optimizer_params = get_optimizer_params(self._param_dict)
        self.scheduler_name = get_scheduler_name(self._param_dict)
        self.scheduler_params = get_scheduler_params(self._param_dict)

    def print_user_config(self) -> None:
        from deepspeed.utils.logging import logger

        logger.info(
            "  json = %s",
            json.dumps(self._param_dict, sort_keys=True, indent=4, cls=ScientificNotationEncoder),
        )

    def print(self, name: str) -> None:
        """Log the whole config as JSON under ``name`` (DeepSpeed's ``print``)."""
        from deepspeed.utils.logging import logger

        logger.info(
            "%s:\n%s", name, json.dumps(self.ds_config.model_dump(mode="json"), indent=2, default=str)
        )


class DeepSpeedConfigWriter:
    """Build a config dict key by key and write it as JSON (DeepSpeed's helper)."""

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data = data if data is not None else {}

    def add_config(self, key: str, value: Any) -> None:
        self.data[key] = value

    def load_config(self, filename: str) -> None:
        with open(filename) as f:
            self.data = json.load(f, object_pairs_hook=dict_raise_error_on_duplicate_keys)

    def write_config(self, filename: str) -> None:
        with open(filename, "w") as f:
            json.dump(self.data, f)


# ---- DeepSpeed's readers of one key of a raw config dict; each value is ds_config's (validated, with
# DeepSpeed 0.19.8's defaults)
def get_gradient_clipping(param_dict: dict[str, Any]) -> float:
    return _section(param_dict, "gradient_clipping")


def get_gradient_allreduce_op(param_dict: dict[str, Any]) -> str:
    return _section(param_dict, "gradient_allreduce_op")


def get_prescale_gradients(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "prescale_gradients")


def get_gradient_predivide_factor(param_dict: dict[str, Any]) -> float:
    return _section(param_dict, "gradient_predivide_factor")


def get_steps_per_print(param_dict: dict[str, Any]) -> int:
    return _section(param_dict, "steps_per_print")


def get_disable_allgather(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "disable_allgather")


def get_dump_state(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "dump_state")


def get_wall_clock_breakdown(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "wall_clock_breakdown")


def get_memory_breakdown(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "memory_breakdown")


def get_dataloader_drop_last(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "dataloader_drop_last")


def get_zero_allow_untested_optimizer(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "zero_allow_untested_optimizer")


def get_zero_force_ds_cpu_optimizer(param_dict: dict[str, Any]) -> bool:
    return _section(param_dict, "zero_force_ds_cpu_optimizer")


def get_train_batch_size(param_dict: dict[str, Any]) -> int | None:
    """The key as given (None when absent): DeepSpeed derives the batch triple later, in DeepSpeedConfig."""
    return get_scalar_param(param_dict, "train_batch_size", None)


def get_train_micro_batch_size_per_gpu(param_dict: dict[str, Any]) -> int | None:
    return get_scalar_param(param_dict, "train_micro_batch_size_per_gpu", None)


def get_gradient_accumulation_steps(param_dict: dict[str, Any]) -> int | None:
    return get_scalar_param(param_dict, "gradient_accumulation_steps", None)


def get_pipeline_config(param_dict: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's pipeline defaults updated with the config's ``pipeline`` section."""
    return {**PIPELINE_DEFAULTS, **_section(param_dict, "pipeline").model_dump(exclude_unset=True)}


def get_optimizer_name(param_dict: dict[str, Any]) -> str | None:
    """The optimizer section's type as written, or None without one (DeepSpeedConfig lower-cases
    DeepSpeed's own optimizers' names)."""
    section = _section(param_dict, "optimizer")
    return param_dict[OPTIMIZER][TYPE] if section is not None else None  # noqa: F405


def get_optimizer_params(param_dict: dict[str, Any]) -> dict[str, Any] | None:
    section = _section(param_dict, "optimizer")
    return dict(section.params) if section is not None else None


def get_optimizer_gradient_clipping(param_dict: dict[str, Any]) -> float | None:
    """The optimizer params' ``max_grad_norm`` (DeepSpeed's legacy spelling of clipping), or None."""
    params = get_optimizer_params(param_dict)
    return params.get(MAX_GRAD_NORM) if params is not None else None  # noqa: F405


def get_scheduler_name(param_dict: dict[str, Any]) -> str | None:
    section = _section(param_dict, "scheduler")
    return section.type if section is not None else None


def get_scheduler_params(param_dict: dict[str, Any]) -> dict[str, Any] | None:
    section = _section(param_dict, "scheduler")
    return dict(section.params) if section is not None else None


__all__ = sorted(
    {
        *_constants,
        "ADAGRAD_OPTIMIZER",
        "ADAMW_OPTIMIZER",
        "ADAM_OPTIMIZER",
        "ADAM_W_MODE",
        "ADAM_W_MODE_DEFAULT",
        "DEEPSPEED_DEFAULTS",
        "DEEPSPEED_OPTIMIZERS",
        "DeepSpeedConfig",
        "DeepSpeedConfigError",
        "DeepSpeedConfigModel",
        "DeepSpeedConfigWriter",
        "LAMB_OPTIMIZER",
        "LION_OPTIMIZER",
        "MUADAMW_OPTIMIZER",
        "MUADAM_OPTIMIZER",
        "MUON_OPTIMIZER",
        "MUSGD_OPTIMIZER",
        "ScientificNotationEncoder",
        "TORCH_ADAM_PARAM",
        "ZeroStageEnum",
        "deepspeed_defaults",
        "dict_raise_error_on_duplicate_keys",
        "get_scalar_param",
        "load_param_dict",
        *(name for name in dir() if name.startswith("get_")),
    }
)  # noqa: PLE0605

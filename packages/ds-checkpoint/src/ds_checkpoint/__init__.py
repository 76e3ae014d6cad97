"""Activation checkpointing, and pickle-free training-state checkpoints that load at any world size."""

from ._clone import clone_tensors_for_torch_save
from ._config_fields import CONFIG_FIELDS
from ._deepspeed_import import DeepSpeedCheckpoint, load_deepspeed, safe_torch_load
from ._deepspeed_names import layer_ckpt_name_for_rank, model_ckpt_name_for_rank, zero_ckpt_name_for_rank
from ._errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointTagNotFoundError,
    ClientStateError,
    DeepSpeedImportError,
    ShardFormatError,
    TagValidationError,
)
from ._export import export_fp32, fp32_state_dict
from ._format import expert_file
from ._load import LoadedState, load_state, read_shard, resolve_checkpoint
from ._save import save_state, validate_tag
from .activation import (
    checkpoint,
    configure,
    get_cuda_rng_tracker,
    get_rng_tracker,
    is_configured,
    model_parallel_cuda_manual_seed,
    model_parallel_manual_seed,
)

__version__ = "0.1.0"
__all__ = [
    "layer_ckpt_name_for_rank",
    "model_ckpt_name_for_rank",
    "zero_ckpt_name_for_rank",
    "CONFIG_FIELDS",
    "__version__",
    # activation checkpointing (ds_checkpoint.activation holds the rest: reset, errors, settings)
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "get_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "model_parallel_manual_seed",
    # training-state checkpoints
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointTagNotFoundError",
    "ClientStateError",
    "DeepSpeedCheckpoint",
    "DeepSpeedImportError",
    "LoadedState",
    "clone_tensors_for_torch_save",
    "ShardFormatError",
    "TagValidationError",
    "expert_file",
    "export_fp32",
    "fp32_state_dict",
    "load_deepspeed",
    "safe_torch_load",
    "load_state",
    "read_shard",
    "resolve_checkpoint",
    "save_state",
    "validate_tag",
]

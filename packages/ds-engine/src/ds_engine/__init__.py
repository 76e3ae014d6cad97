"""ds-engine: ``initialize()``, the engine and the training loop; it assembles the ds-* packages.

A DeepSpeed script works by changing ``import deepspeed`` to ``import ds_engine as deepspeed``: the
modules such scripts import (``accelerator``, ``comm``, ``utils``, ``ops``, ``checkpointing``) are thin
mappings onto the ds-* packages, and ``moe`` / ``init_inference`` fail at use, naming the DeepSpeed
feature ds does not have. A ``ds_pipe.PipelineModule`` given to ``initialize()`` gets a ``PipelineEngine``.
"""

import ds_pipe as pipe

from ds_engine import accelerator, checkpointing, comm, moe, ops, sparse_attention, utils, zero
from ds_engine._args import InitializeError, add_config_arguments
from ds_engine._config_fields import CONFIG_FIELDS
from ds_engine._dist import init_distributed
from ds_engine._engine import DeepSpeedEngine
from ds_engine._initialize import initialize
from ds_engine._missing import FeatureNotAvailableError, missing_function
from ds_engine._pipe_engine import PipelineEngine

__version__ = "0.1.0"

init_inference = missing_function(
    __name__,
    "init_inference",
    "the inference engine (deepspeed.init_inference: kernel injection, tensor-parallel inference)",
    "Run the trained module directly (engine.module or your model) under torch.no_grad().",
)

__all__ = [
    "CONFIG_FIELDS",
    "DeepSpeedEngine",
    "FeatureNotAvailableError",
    "InitializeError",
    "PipelineEngine",
    "__version__",
    "accelerator",
    "add_config_arguments",
    "checkpointing",
    "comm",
    "init_distributed",
    "init_inference",
    "initialize",
    "moe",
    "ops",
    "pipe",
    "sparse_attention",
    "utils",
    "zero",
]

"""ds-engine: ``initialize()``, the engine and the training loop; it assembles the ds-* packages.

DeepSpeed's module paths (``deepspeed.accelerator``, ``deepspeed.comm``, ``deepspeed.utils``,
``deepspeed.ops``, ...) live in the ``deepspeed`` package (packages/deepspeed), the one compatibility
layer over this engine: a DeepSpeed script runs unchanged with it installed. A ``ds_pipe.PipelineModule``
given to ``initialize()`` gets a ``PipelineEngine``.
"""

import ds_pipe as pipe

from ds_engine import sparse_attention, zero
from ds_engine._args import InitializeError, add_config_arguments
from ds_engine._config_fields import CONFIG_FIELDS
from ds_engine._dist import init_distributed
from ds_engine._engine import DeepSpeedEngine
from ds_engine._initialize import initialize
from ds_engine._missing import FeatureNotAvailableError
from ds_engine._pipe_engine import PipelineEngine

__version__ = "0.1.0"

__all__ = [
    "CONFIG_FIELDS",
    "DeepSpeedEngine",
    "FeatureNotAvailableError",
    "InitializeError",
    "PipelineEngine",
    "__version__",
    "add_config_arguments",
    "init_distributed",
    "initialize",
    "pipe",
    "sparse_attention",
    "zero",
]

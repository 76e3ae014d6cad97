"""ds-engine: ``initialize()``, the engine and the training loop; it assembles the ds-* packages.

A DeepSpeed script works by changing ``import deepspeed`` to ``import ds_engine as deepspeed``.
"""

from ds_engine import checkpointing, sparse_attention, zero
from ds_engine._args import InitializeError, add_config_arguments
from ds_engine._config_fields import CONFIG_FIELDS
from ds_engine._dist import init_distributed
from ds_engine._engine import DeepSpeedEngine
from ds_engine._initialize import initialize

__version__ = "0.1.0"
__all__ = [
    "CONFIG_FIELDS",
    "DeepSpeedEngine",
    "InitializeError",
    "__version__",
    "add_config_arguments",
    "checkpointing",
    "init_distributed",
    "initialize",
    "sparse_attention",
    "zero",
]

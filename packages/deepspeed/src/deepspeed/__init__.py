"""``import deepspeed``, answered by ds: DeepSpeed's public names and module paths, mapped onto ds_engine.

Installing this package (distribution ``deepspeed``) lets code written against DeepSpeed, and the
frameworks that import it themselves (Hugging Face Trainer, Accelerate, Lightning), run on ds unchanged.
It is a thin mapping: every name forwards to the one implementation in ds_engine and the ds-* packages;
nothing here trains. DeepSpeed features ds does not have are importable and fail at use with
:class:`FeatureNotAvailableError` naming the feature.

``__version__`` is the DeepSpeed API level mapped, with ds's own version as the local label
(``0.19.8+ds.0.1.0``); ``deepspeed.__ds__`` / ``deepspeed.IMPLEMENTATION`` say that ds is running, and
``initialize()`` logs it once. Importing this package warns loudly when a real DeepSpeed is installed
beside it (see ``deepspeed._shadow``).
"""

from __future__ import annotations

import logging
from typing import Any

import ds_engine
from ds_engine import DeepSpeedEngine, FeatureNotAvailableError, InitializeError, add_config_arguments
from ds_engine import init_distributed as _ds_init_distributed
from ds_engine import initialize as _ds_initialize

from deepspeed import _shadow

__version__ = "0.19.8+ds.0.1.0"
# the DeepSpeed release whose public API this package maps
DEEPSPEED_API_VERSION = __version__.split("+")[0]
__version_major__, __version_minor__, __version_patch__ = (int(p) for p in DEEPSPEED_API_VERSION.split("."))
__git_hash__ = None
__git_branch__ = None
# what is running under the DeepSpeed name
__ds__ = ds_engine.__version__
IMPLEMENTATION = f"ds {ds_engine.__version__} (DeepSpeed {DEEPSPEED_API_VERSION} API, not DeepSpeed itself)"

_shadow.warn_conflicts()

from deepspeed import accelerator, checkpoint, comm, launcher, moe, ops, pipe, runtime, utils  # noqa: E402
from deepspeed.runtime import zero  # noqa: E402
from deepspeed.utils.logging import logger  # noqa: E402

checkpointing = ds_engine.checkpointing
init_inference = ds_engine.init_inference
log_dist = utils.log_dist
dist = comm

_announced = False

# Config defaults where DeepSpeed 0.19.8 differs from ds's own (which follow the config reference and
# spec/decisions.md): 0.19 clips gradients to norm 1.0 unless the config says otherwise, and its fp16 loss
# scale starts at 2**16 (ds_engine's at 2**32). Without these, a config that leaves the keys out (the
# Trainer's and Accelerate's usual ones) would train differently under `import deepspeed`.
DEEPSPEED_DEFAULTS = {"gradient_clipping": 1.0, "fp16": {"initial_scale_power": 16}}


def initialize(*args: Any, **kwargs: Any) -> tuple[DeepSpeedEngine, Any, Any, Any]:
    """DeepSpeed's ``deepspeed.initialize``: ds_engine's ``initialize``, then one log line saying ds runs.

    Every argument (``args``, ``model``, ``optimizer``, ``model_parameters``, ``training_data``,
    ``lr_scheduler``, ``mpu``, ``dist_init_required``, ``collate_fn``, ``config``, ``config_params``)
    is passed through unchanged; see :func:`ds_engine.initialize`. Keys the config leaves out take
    DeepSpeed 0.19.8's defaults (:data:`DEEPSPEED_DEFAULTS`).
    """
    global _announced
    kwargs.setdefault("defaults", DEEPSPEED_DEFAULTS)
    result = _ds_initialize(*args, **kwargs)
    if not _announced and comm.get_rank() == 0:
        logging.getLogger("ds_engine").info("deepspeed is %s", IMPLEMENTATION)
    _announced = True
    return result


initialize.__wrapped__ = _ds_initialize  # type: ignore[attr-defined]
init_distributed = _ds_init_distributed

__all__ = [
    "DEEPSPEED_API_VERSION",
    "DEEPSPEED_DEFAULTS",
    "IMPLEMENTATION",
    "DeepSpeedEngine",
    "FeatureNotAvailableError",
    "InitializeError",
    "__ds__",
    "__version__",
    "accelerator",
    "add_config_arguments",
    "checkpoint",
    "checkpointing",
    "comm",
    "dist",
    "init_distributed",
    "init_inference",
    "initialize",
    "launcher",
    "log_dist",
    "logger",
    "moe",
    "ops",
    "pipe",
    "runtime",
    "utils",
    "zero",
]

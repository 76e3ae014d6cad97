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

import copy
import logging
import os
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

from deepspeed.runtime.config import DEEPSPEED_DEFAULTS, DeepSpeedConfigError  # noqa: E402
from deepspeed.runtime.config import deepspeed_defaults as _deepspeed_defaults  # noqa: E402
from deepspeed.runtime.config import load_param_dict as _load_param_dict  # noqa: E402

_announced = False


def initialize(*args: Any, **kwargs: Any) -> tuple[DeepSpeedEngine, Any, Any, Any]:
    """DeepSpeed's ``deepspeed.initialize``: ds_engine's ``initialize``, then one log line saying ds runs.

    Every argument (``args``, ``model``, ``optimizer``, ``model_parameters``, ``training_data``,
    ``lr_scheduler``, ``mpu``, ``dist_init_required``, ``collate_fn``, ``config``, ``config_params``)
    is passed through; see :func:`ds_engine.initialize`. A config file is read as hjson, as DeepSpeed reads
    it (JSON is hjson), and keys the config leaves out take DeepSpeed 0.19.8's defaults
    (:func:`deepspeed.runtime.config.deepspeed_defaults`).
    """
    global _announced
    kwargs.setdefault("defaults", _deepspeed_defaults)
    args = _read_config_files_as_hjson(args, kwargs)
    result = _ds_initialize(*args, **kwargs)
    if not _announced and comm.get_rank() == 0:
        logging.getLogger("ds_engine").info("deepspeed is %s", IMPLEMENTATION)
    _announced = True
    return result


def _read_config_files_as_hjson(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Replace a config given as a file path (``config=``, ``config_params=`` or ``args.deepspeed_config``)
    by its hjson-parsed dict (``kwargs`` in place; the positional arguments returned); ds_engine then
    validates that dict."""
    for key in ("config", "config_params"):
        if _is_file(kwargs.get(key)):
            kwargs[key] = _load_param_dict(kwargs[key])
    cli = args[0] if args else kwargs.get("args")
    path = getattr(cli, "deepspeed_config", None)
    if _is_file(path):
        cli = copy.copy(cli)  # the script's own namespace keeps its path
        cli.deepspeed_config = _load_param_dict(path)
        if args:
            return (cli, *args[1:])
        kwargs["args"] = cli
    return args


def _is_file(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.path.isfile(value)


initialize.__wrapped__ = _ds_initialize  # type: ignore[attr-defined]
init_distributed = _ds_init_distributed

__all__ = [
    "DEEPSPEED_API_VERSION",
    "DEEPSPEED_DEFAULTS",
    "IMPLEMENTATION",
    "DeepSpeedConfigError",
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

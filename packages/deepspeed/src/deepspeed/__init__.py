"""``import deepspeed``, answered by ds: DeepSpeed's public names and module paths, over ds_engine.

Installing this package (distribution ``deepspeed``) lets code written against DeepSpeed, and the
frameworks that import it themselves (Hugging Face Trainer, Accelerate, Lightning), run on ds unchanged.
It is ds's one compatibility layer: everything that exists only to look like DeepSpeed (the accelerator,
comm, groups, ops and op builders, utils, the optimizer class names) lives here, over the engine
(ds_engine) and the ds-* packages; nothing here trains. DeepSpeed features ds does not have are
importable and fail at use with :class:`FeatureNotAvailableError` naming the feature.

``__version__`` is the DeepSpeed API level mapped, with ds's own version as the local label
(``0.19.8+ds.0.1.0``); ``deepspeed.__ds__`` / ``deepspeed.IMPLEMENTATION`` say that ds is running, and
``initialize()`` logs it once. Importing this package warns loudly when a real DeepSpeed is installed
beside it (see ``deepspeed._shadow``).
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from typing import Any

import ds_engine
from ds_engine import DeepSpeedEngine, FeatureNotAvailableError, InitializeError, add_config_arguments
from ds_engine import init_distributed as _ds_init_distributed
from ds_engine import initialize as _ds_initialize

from deepspeed import _shadow
from deepspeed._version import __version__

# the DeepSpeed release whose public API this package maps
DEEPSPEED_API_VERSION = __version__.split("+")[0]
__version_major__, __version_minor__, __version_patch__ = (int(p) for p in DEEPSPEED_API_VERSION.split("."))
__git_hash__ = None
__git_branch__ = None
# what is running under the DeepSpeed name
__ds__ = ds_engine.__version__
IMPLEMENTATION = f"ds {ds_engine.__version__} (DeepSpeed {DEEPSPEED_API_VERSION} API, not DeepSpeed itself)"

_shadow.warn_conflicts()

from ds_engine._missing import missing_class as _missing_class  # noqa: E402
from ds_engine._missing import missing_function as _missing_function  # noqa: E402

from deepspeed import accelerator, checkpoint, comm, launcher, moe, ops, pipe, runtime, utils  # noqa: E402
from deepspeed import constants as constants  # noqa: E402
from deepspeed import git_version_info as git_version_info  # noqa: E402
from deepspeed.accelerator import get_accelerator  # noqa: E402
from deepspeed.constants import TORCH_DISTRIBUTED_DEFAULT_PORT  # noqa: E402
from deepspeed.git_version_info import git_branch, git_hash, version  # noqa: E402
from deepspeed.pipe import PipelineModule  # noqa: E402
from deepspeed.runtime import zero  # noqa: E402
from deepspeed.runtime.activation_checkpointing import checkpointing  # noqa: E402
from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer  # noqa: E402
from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError  # noqa: E402
from deepspeed.runtime.pipe.engine import PipelineEngine  # noqa: E402
from deepspeed.utils.init_on_device import OnDevice  # noqa: E402
from deepspeed.utils.logging import logger  # noqa: E402

init_inference = _missing_function(
    __name__,
    "init_inference",
    "the inference engine (deepspeed.init_inference: kernel injection, tensor-parallel inference)",
    "Run the trained module directly (engine.module or your model) under torch.no_grad().",
)
log_dist = utils.log_dist
dist = comm

from deepspeed.runtime.config import DEEPSPEED_DEFAULTS  # noqa: E402
from deepspeed.runtime.config import deepspeed_defaults as _deepspeed_defaults  # noqa: E402
from deepspeed.runtime.config import load_param_dict as _load_param_dict  # noqa: E402

# DeepSpeed's top-level classes of features ds does not have: importable, fail at use naming the feature
InferenceEngine = _missing_class(
    __name__,
    "InferenceEngine",
    "DeepSpeed-Inference (deepspeed.init_inference)",
    "Run the model with torch for inference.",
)
DeepSpeedHybridEngine = _missing_class(
    __name__,
    "DeepSpeedHybridEngine",
    "DeepSpeed's hybrid (RLHF) engine",
    "Use deepspeed.initialize's engine.",
)
DeepSpeedTransformerLayer = _missing_class(
    __name__,
    "DeepSpeedTransformerLayer",
    "DeepSpeed's fused transformer kernels (deepspeed.ops.transformer)",
    "Use a torch transformer layer.",
)
DeepSpeedTransformerConfig = _missing_class(
    __name__,
    "DeepSpeedTransformerConfig",
    "DeepSpeed's fused transformer kernels (deepspeed.ops.transformer)",
    "Use a torch transformer layer.",
)

_tp_model_init_args: dict[str, Any] = {}


def tp_model_init(model: Any, tp_size: int, dtype: Any, config: Any = None, **kwargs: Any) -> Any:
    """DeepSpeed's ``deepspeed.tp_model_init`` (the Trainer calls it when ``autotp_size`` > 1): records the
    tensor-parallel degree for the next :func:`initialize`, which splits the model (as DeepSpeed 0.19.8, where
    it only records too); returns ``model`` unchanged. A config's ``tensor_parallel.autotp_size`` that differs
    from ``tp_size`` is an error there. ``tp_group`` must be the group ds builds: ``tp_size`` consecutive ranks.
    """
    group = kwargs.get("tp_group")
    if group is not None:
        import torch.distributed as _dist

        ranks = _dist.get_process_group_ranks(group)
        first = ranks[0] - ranks[0] % tp_size if ranks else 0
        if list(ranks) != list(range(first, first + tp_size)):
            raise FeatureNotAvailableError(
                f"deepspeed.tp_model_init(tp_group=...) with ranks {list(ranks)}: ds builds the tensor-parallel "
                f"group itself, of {tp_size} consecutive ranks; leave tp_group unset"
            )
    _tp_model_init_args.update(tp_size=tp_size, dtype=dtype)
    return model


def _with_tp_model_init(raw: dict) -> dict:
    """``raw`` with the degree tp_model_init recorded filled in (DeepSpeed's merge: the config wins where it has
    the key; a different value is an error)."""
    if not _tp_model_init_args or not isinstance(raw, dict):
        return raw
    tp_size = _tp_model_init_args["tp_size"]
    section = dict(raw.get("tensor_parallel") or {})
    given = section.get("autotp_size")
    if given is not None and given != tp_size:
        raise ValueError(
            f"Conflicting tensor_parallel.autotp_size in config ({given}) and tp_model_init ({tp_size})."
        )
    section["autotp_size"] = tp_size
    return {**raw, "tensor_parallel": section}


_announced = False


def initialize(
    args: Any = None,
    model: Any = None,
    optimizer: Any = None,
    model_parameters: Any = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    distributed_port: int = TORCH_DISTRIBUTED_DEFAULT_PORT,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Any = None,
    config: Any = None,
    mesh_param: Any = None,
    config_params: Any = None,
    *,
    config_strict: bool | None = None,
    defaults: Any = None,
) -> tuple[DeepSpeedEngine, Any, Any, Any]:
    """DeepSpeed's ``deepspeed.initialize`` (its parameters, in its order): ds_engine's ``initialize``, then one
    log line saying ds runs.

    Every argument is passed to :func:`ds_engine.initialize` by name. A config given as a file path
    (``config``, ``config_params`` or ``args.deepspeed_config``) is read as hjson, as DeepSpeed reads it (JSON
    is hjson). Keys the config leaves out take DeepSpeed 0.19.8's defaults
    (:func:`deepspeed.runtime.config.deepspeed_defaults`) unless ``defaults`` says otherwise.
    ``mesh_param`` (DeepSpeed's device mesh for tensor/sequence parallelism) is refused: ds is data parallel.
    """
    global _announced
    if mesh_param is not None:
        raise FeatureNotAvailableError(
            "deepspeed.initialize(mesh_param=...): a device mesh for tensor/sequence parallelism is not available "
            "in ds (DeepSpeed has it, ds does not). ds is data parallel: leave mesh_param unset."
        )
    config, config_params = (_load_param_dict(c) if _is_file(c) else c for c in (config, config_params))
    path = getattr(args, "deepspeed_config", None)
    if _is_file(path):
        args = copy.copy(args)  # the script's own namespace keeps its path
        args.deepspeed_config = _load_param_dict(path)
    result = _ds_initialize(
        args=args,
        model=model,
        optimizer=optimizer,
        model_parameters=model_parameters,
        training_data=training_data,
        lr_scheduler=lr_scheduler,
        mpu=mpu,
        dist_init_required=dist_init_required,
        collate_fn=collate_fn,
        config=config,
        config_params=config_params,
        distributed_port=distributed_port,
        config_strict=config_strict,
        defaults=_tp_defaults(defaults),
    )
    if not _announced and comm.get_rank() == 0:
        logging.getLogger("ds_engine").info("deepspeed is %s", IMPLEMENTATION)
    _announced = True
    return result


def _tp_defaults(defaults: Any) -> Any:
    """DeepSpeed's defaults (or the caller's), then what tp_model_init recorded."""
    if not _tp_model_init_args:
        return _deepspeed_defaults if defaults is None else defaults
    base = _deepspeed_defaults if defaults is None else defaults
    if callable(base):
        return lambda raw: _with_tp_model_init(base(raw))
    from ds_engine._initialize import _under

    return lambda raw: _with_tp_model_init(_under(raw, base))


def _is_file(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike)) and os.path.isfile(value)


initialize.__wrapped__ = _ds_initialize  # type: ignore[attr-defined]
initialize.__signature__ = inspect.signature(initialize, follow_wrapped=False)  # type: ignore[attr-defined]
init_distributed = _ds_init_distributed

__all__ = [
    "DEEPSPEED_API_VERSION",
    "DEEPSPEED_DEFAULTS",
    "DeepSpeedConfig",
    "DeepSpeedConfigError",
    "DeepSpeedHybridEngine",
    "DeepSpeedOptimizer",
    "DeepSpeedTransformerConfig",
    "DeepSpeedTransformerLayer",
    "InferenceEngine",
    "OnDevice",
    "PipelineEngine",
    "PipelineModule",
    "TORCH_DISTRIBUTED_DEFAULT_PORT",
    "constants",
    "get_accelerator",
    "git_branch",
    "git_hash",
    "git_version_info",
    "version",
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
    "tp_model_init",
    "utils",
    "zero",
]

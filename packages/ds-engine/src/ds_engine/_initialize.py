"""``initialize()``: DeepSpeed's entry point, with its argument rules."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

import ds_launch
import ds_pipe
import torch.distributed as dist
from ds_config import ConfigError, DSConfig, env_flag, load_config, read_source
from torch import nn

from ds_engine._args import InitializeError, check_local_rank, resolve_config_source
from ds_engine._assemble import assemble
from ds_engine._data import build_dataloader
from ds_engine._engine import DeepSpeedEngine
from ds_engine._log_handler import AboveProgressBars
from ds_engine._pipe_engine import PipelineEngine
from ds_engine._pipe_setup import check_pipeline_config, pipeline_grid
from ds_engine._sequence import is_sequence_mpu, sequence_grid, sequence_parallel_hint, sequence_parallel_size
from ds_engine.topology import ParallelTopology, build_topology

logger = logging.getLogger("ds_engine")

STRICT_ENV = "DS_CONFIG_STRICT"

# how ds_launch's rank sources read in a batch-size error ("where the world size came from")
_WORLD_SIZE_SOURCES = {
    "mpi4py": "MPI environment (mpi4py)",
    "env:OMPI": "MPI environment (OMPI_*)",
    "env:PMI": "MPI environment (PMI_*)",
    "slurm": "SLURM environment",
    "env:RANK": "torch.distributed (WORLD_SIZE from the launcher)",
    "torch.distributed": "torch.distributed",
    "default": "default 1 (no launcher)",
}


def initialize(
    args: Any = None,
    model: nn.Module | None = None,
    optimizer: Any = None,
    model_parameters: Any = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Any = None,
    config: Any = None,
    config_params: Any = None,
    distributed_port: int = 29500,
    config_strict: bool | None = None,
    defaults: Mapping[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> tuple[DeepSpeedEngine, Any, Any, Any]:
    """Build the engine; returns ``(engine, optimizer, training_dataloader, lr_scheduler)`` like DeepSpeed.

    The config comes from exactly one of ``args.deepspeed_config``, ``config`` (dict, JSON path or
    base64 JSON) and ``config_params``. torch.distributed is initialised from whatever launched the
    script (``ds-launch``, ``mpirun``, torchrun, plain ``python``) unless ``dist_init_required`` is False.

    ``config_strict=False`` (or the environment variable ``DS_CONFIG_STRICT=0``) loads a foreign config
    leniently: unknown keys warn and are ignored. Enabled features ds lacks are errors either way.
    With fp32 at ZeRO stage 0 the optimizer returned is the torch optimizer itself (the one the script
    passed, if it passed one), as in DeepSpeed; otherwise it is the engine's wrapper.

    ``defaults`` fills keys the config leaves out, nested ones included: a mapping of them, or a function
    from the raw config dict to the one to load (the ``deepspeed`` package passes one that applies the
    defaults of the DeepSpeed release it maps where they differ from ds's own, some of them by ZeRO stage).
    """
    ds_launch.install_excepthook()  # an uncaught ConfigError: its message once, no traceback
    if model is None:
        raise InitializeError("ds_engine.initialize requires a model: initialize(model=my_module, ...)")
    source = resolve_config_source(args, config, config_params)
    if defaults:
        raw, _ = read_source(source)
        source = defaults(raw) if callable(defaults) else _under(raw, defaults)
    _setup_logging()
    if dist_init_required is False and not dist.is_initialized():
        raise InitializeError(
            "dist_init_required=False but torch.distributed is not initialised: call "
            "torch.distributed.init_process_group first, or leave dist_init_required unset"
        )
    topology = ds_launch.init_distributed(distributed_port=distributed_port)
    check_local_rank(args, topology.local_rank)
    grid = pipeline_grid(model, mpu) if isinstance(model, ds_pipe.PipelineModule) else None
    mpu = grid if grid is not None else mpu
    sequence_mpu, mpu = (mpu, None) if is_sequence_mpu(mpu) else (None, mpu)  # replaced by a grid below
    parallel = _parallel_topology(source, mpu, topology.world_size)
    # the batch sizes count every rank under AutoTP, as DeepSpeed 0.19.8 derives them (its config is read before
    # the tensor-parallel groups exist); the data-parallel ranks are what the loader shards over
    dp_world_size = mpu.get_data_parallel_world_size() if mpu is not None else topology.world_size
    dp_world_size //= sequence_parallel_hint(
        source, sequence_mpu, dp_world_size
    )  # the batch math: world / sp
    cfg = _load(
        source,
        dp_world_size,
        "mpu data-parallel group"
        if mpu is not None
        else _WORLD_SIZE_SOURCES.get(topology.source, topology.source),
        config_strict,
    )
    if grid is not None:
        check_pipeline_config(cfg, model)
    sp = sequence_parallel_size(cfg, sequence_mpu, topology.world_size)
    if sp > 1:  # Ulysses: the topology's sequence axis; the batch math's data-parallel size is world / sp
        if grid is not None or parallel is not None:
            raise InitializeError(
                f"sequence_parallel_size {sp} together with a PipelineModule or tensor_parallel.autotp_size is not "
                "in ds: use one of them"
            )
        mpu = sequence_grid(sp)
        cfg = cfg.model_copy(update={"sequence_parallel_size": sp})  # the mpu's degree, when it gave it
    parts = assemble(
        model,
        cfg,
        topology,
        optimizer=optimizer,
        model_parameters=model_parameters,
        lr_scheduler=lr_scheduler,
        mpu=mpu,
        norm_group=grid.get_pipe_parallel_group()
        if grid is not None and grid.pipe_parallel_size > 1
        else None,
        parallel=parallel,
    )
    loader = None
    if training_data is not None:
        dp_rank = (
            mpu.get_data_parallel_rank()
            if mpu is not None
            else parallel.coord("data")
            if parallel is not None
            else topology.rank
        )
        loader = build_dataloader(
            training_data,
            micro_batch_size=cfg.train_micro_batch_size_per_gpu,
            rank=dp_rank,
            world_size=parallel.size("data") if parallel is not None and mpu is None else dp_world_size,
            collate_fn=collate_fn,
            drop_last=cfg.dataloader_drop_last,
        )
    engine = (
        DeepSpeedEngine(parts, cfg, topology, loader)
        if grid is None
        else PipelineEngine(parts, cfg, topology, loader, grid)
    )
    if topology.rank == 0:
        logger.info(
            "%s | train_batch_size=%d micro_batch=%d grad_accum=%d zero_stage=%d dtype=%s",
            topology.describe(),
            cfg.train_batch_size,
            cfg.train_micro_batch_size_per_gpu,
            cfg.gradient_accumulation_steps,
            cfg.zero_optimization.stage,
            parts.dtype,
        )
    # DeepSpeed hands back its own wrapper only when there is one; at fp32 stage 0 it is the bare optimizer
    bare = cfg.precision == "fp32" and cfg.zero_optimization.stage == 0
    return engine, engine.basic_optimizer if bare else engine.optimizer, loader, engine.lr_scheduler


def _parallel_topology(source: Any, mpu: Any, world_size: int) -> ParallelTopology | None:
    """The job's topology when the config asks for tensor parallelism (``tensor_parallel.autotp_size``)."""
    raw, _ = read_source(source)
    section = raw.get("tensor_parallel") if isinstance(raw, Mapping) else None
    tp = section.get("autotp_size") if isinstance(section, Mapping) else None
    if not isinstance(tp, int) or isinstance(tp, bool) or tp <= 1:
        return None  # a bad value is load_config's to report
    if mpu is not None:
        raise InitializeError(
            f"tensor_parallel.autotp_size {tp} with an mpu or a PipelineModule: AutoTP together with the mpu's "
            "or a pipeline's groups is not available in ds; drop autotp_size or the mpu"
        )
    if world_size % tp:
        raise InitializeError(
            f"tensor_parallel.autotp_size {tp} does not divide the world size {world_size}; launch a multiple "
            f"of {tp} ranks or pick an autotp_size among {[d for d in range(1, world_size + 1) if world_size % d == 0]}"
        )
    return build_topology(tensor=tp)


def _load(source: Any, world_size: int, world_size_source: str, strict: bool | None) -> DSConfig:
    """``load_config``, strict unless the caller or ``DS_CONFIG_STRICT=0`` asks otherwise."""
    if strict is None:
        strict = env_flag(STRICT_ENV, True)
    try:
        return load_config(source, world_size=world_size, world_size_source=world_size_source, strict=strict)
    except ConfigError as exc:
        if strict and any(p.strict_only for p in exc.problems):
            raise ConfigError(
                exc.problems,
                exc.source,
                hint=(
                    "To load this config anyway, ignoring (with a warning) the keys ds does not know: "
                    f"initialize(..., config_strict=False) or the environment variable {STRICT_ENV}=0."
                ),
            ) from None
        raise


def _setup_logging() -> None:
    """Log to stderr at INFO unless the application configured the ``ds_engine`` logger itself."""
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = AboveProgressBars(sys.stderr)
    handler.setFormatter(logging.Formatter("[ds %(asctime)s] %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _under(config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with ``defaults`` filling the keys it leaves out; a default that is a dict fills a section
    only where the config has that section (``{"fp16": {...}}`` adds nothing to a config without fp16)."""
    out = dict(config)
    for key, value in defaults.items():
        if isinstance(value, Mapping):
            if isinstance(out.get(key), Mapping):
                out[key] = _under(out[key], value)
        else:
            out.setdefault(key, value)
    return out

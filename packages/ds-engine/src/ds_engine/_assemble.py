"""How the packages are combined: one function, in a fixed order (docs/architecture.md says why)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ds_checkpoint
import ds_moe
import ds_optim
import ds_precision
import ds_tpsp.tensor
import ds_zero
import torch
import torch.distributed as dist
from ds_config import DSConfig
from ds_launch import Topology
from torch import nn

from ds_engine._args import InitializeError
from ds_engine._host_groups import zeropp_host_groups
from ds_engine._leaf_config import apply_leaf_module_config
from ds_engine._missing import FeatureNotAvailableError
from ds_engine._moe import MoeParts, setup_moe
from ds_engine.topology import ParallelTopology
from ds_engine.zero import check_partitioned_model

logger = logging.getLogger("ds_engine")


@dataclass
class Parts:
    """What ``assemble`` built. ``optimizer`` is the object the engine steps; ``reducer`` is set at stage 0."""

    model: nn.Module
    dtype: torch.dtype
    optimizer: Any  # MixedPrecisionOptimizer | ZeroOptimizer | apex optimizer | None (evaluation only)
    basic_optimizer: torch.optim.Optimizer | None
    scaler: Any | None
    reducer: ds_zero.GradientReducer | None
    scheduler: Any | None
    dp_group: Any | None
    dp_world_size: int
    client_optimizer: bool = False  # the script passed the optimizer (or a factory) that steps
    evaluation_only: bool = False  # no optimizer was given: forward works, backward and step are refused
    moe: MoeParts | None = None  # the model's mixture-of-experts layers (ds_moe), if any


def model_dtype(cfg: DSConfig) -> torch.dtype:
    """The dtype the model's weights train in (amp keeps fp32 weights and casts inside forward)."""
    if cfg.fp16.enabled:
        return torch.float16
    if cfg.bf16.enabled:
        return torch.bfloat16
    return torch.float32


def assemble(
    model: nn.Module,
    cfg: DSConfig,
    topology: Topology,
    *,
    optimizer: Any = None,
    model_parameters: Any = None,
    lr_scheduler: Any = None,
    mpu: Any = None,
    norm_group: Any = None,
    parallel: ParallelTopology | None = None,
) -> Parts:
    """Build the training stack around ``model``. The order matters; each step says why it comes where it does.

    ``norm_group``: the group over which the gradient norm and the overflow test are reduced besides the
    data-parallel one (a pipeline's stages); by default the mpu's model-parallel group.
    """
    dp_group = mpu.get_data_parallel_group() if mpu is not None else None
    dp_world_size = mpu.get_data_parallel_world_size() if mpu is not None else topology.world_size
    mp_group = norm_group if norm_group is not None else _model_parallel_group(mpu)

    # 0. Tensor parallelism splits the layers first: everything below sees this rank's shards, ZeRO
    # partitions them over the data axis and the norm sums the shards over the tensor axis.
    if parallel is not None and parallel.size("tensor") > 1:
        dp_group, dp_world_size = parallel.group("data"), parallel.size("data")
        mp_group = parallel.group("tensor")
        plan = ds_tpsp.tensor.shard_model(model, mp_group, cfg.tensor_parallel)
        # an optimizer or parameter list made before the split (the Trainer makes both) now holds the shards
        if isinstance(optimizer, torch.optim.Optimizer):
            plan.remap_optimizer(optimizer)
        if model_parameters is not None:
            model_parameters = plan.remap(model_parameters)
        if topology.rank == 0:
            logger.info(
                "AutoTP: %d layers split over %d ranks (rules: %s)",
                len(plan.layers),
                plan.degree,
                plan.source,
            )

    # 1. ZeRO-3 leaf modules of the config (DeepSpeed marks them first, at every stage: Hugging Face's sparse
    # MoE blocks by default), so that stage 3 finds them when it installs its hooks.
    apply_leaf_module_config(model, cfg.zero_optimization.leaf_module)
    # dtype and device first: ZeRO and the fp32 master copies flatten the parameters as they are.
    check_partitioned_model(model, cfg.zero_optimization.stage)
    dtype = model_dtype(cfg)
    model.to(device=topology.device, dtype=dtype)
    # MoE layers get their expert groups; experts start equal within their expert-data group only
    moe = setup_moe(model, cfg.zero_optimization.stage, dp_world_size)
    _broadcast_parameters(model, dp_group, skip=moe.expert_params if moe is not None else ())
    if moe is not None:
        moe.broadcast()

    # 2. The optimizer exists before anything wraps it (the client's wins over the config's, as in DeepSpeed).
    params = list(model_parameters) if model_parameters is not None else list(model.parameters())
    if moe is not None and optimizer is None and cfg.optimizer is not None:
        # DeepSpeed gives a config optimizer of an MoE model its experts in groups of their own
        params = ds_moe.configure_moe_param_groups(params)
    basic = _build_optimizer(cfg, params, optimizer, dp_group)
    if basic is None:  # an engine for evaluation (DeepSpeed's rules: ZeRO 1 and 2 need an optimizer)
        stage = cfg.zero_optimization.stage
        if stage in (1, 2):
            raise InitializeError(f"zero stage {stage} requires an optimizer")
        if stage == 0:
            scheduler = lr_scheduler if hasattr(lr_scheduler, "step") else None
            return Parts(
                model, dtype, None, None, None, None, scheduler, dp_group, dp_world_size, False, True, moe
            )
        # stage 3 partitions the model and gathers it in forward: its optimizer wrapper owns the hooks, so
        # it wraps a placeholder that never steps (the engine refuses backward and step)
        basic = torch.optim.SGD(params, lr=0.0)

    # 3. Precision: the loss scaler is handed to whichever wrapper reduces and steps.
    scaler = ds_precision.loss_scaler_from_config(cfg.fp16) if cfg.fp16.enabled else None
    names = ds_zero.names_of(model)

    # 4. Reduction and partitioning wrap the optimizer (ZeRO re-points it at the rank's partition).
    reducer = None
    if cfg.amp.enabled:
        model, wrapped = ds_precision.amp_initialize(model, basic, cfg.amp)
    elif cfg.zero_optimization.stage in (1, 2):
        # expert-parallel experts: partitioned and reduced over their expert-data-parallel group (_moe)
        experts = moe.partition_groups(basic, cfg.zero_optimization.stage) if moe is not None else None
        wrapped = ds_zero.ZeroOptimizer.from_config(
            basic,
            cfg,
            process_group=dp_group,
            scaler=scaler,
            param_names=names,
            model_parallel_group=mp_group,
            partition_groups=experts,
        )
    elif cfg.zero_optimization.stage == 3:  # stage 3 also partitions the model: its hooks gather the weights
        wrapped = ds_zero.ZeroStage3Optimizer.from_config(
            model,
            basic,
            cfg,
            process_group=dp_group,
            scaler=scaler,
            param_names=names,
            model_parallel_group=mp_group,
            host_groups=zeropp_host_groups(  # ZeRO++: hpZ and qgZ work inside and across hosts
                cfg, dp_group, topology.world_size, topology.rank, topology.local_world_size
            ),
        )
    else:
        wrapped = ds_precision.MixedPrecisionOptimizer(
            basic,
            scaler=scaler,
            dtype=dtype,
            clip_grad=cfg.gradient_clipping,
            process_group=dp_group,
            fp32_grad_accum=_grad_accum_dtype(cfg) == torch.float32,
            module=model,
            model_parallel_group=mp_group,
            # expert-parallel experts differ between ranks: DeepSpeed 0.19.8's stage-0 norm, the same on
            # every rank (fp32: the mean of the ranks' norms; fp16/bf16: the norm without the experts)
            expert_params=moe.expert_params if moe is not None else None,
            expert_norm="rank_mean" if dtype == torch.float32 else "excluded",
        )
    reducing = dist.get_world_size(dp_group) if dp_group is not None else dp_world_size  # sp: data x sequence
    if cfg.zero_optimization.stage == 0 and reducing > 1:  # amp is never ZeRO (ds_config rejects it)
        # with fp32 gradient accumulation the precision wrapper says which buffers hold the gradients
        targets = wrapped.reduction_params() if hasattr(wrapped, "reduction_params") else None
        if moe is not None and moe.groups:  # expert-parallel gradients go over their own group (_moe)
            if targets is not None:
                raise FeatureNotAvailableError(
                    "bf16.grad_accum_dtype fp32 with expert parallelism (an MoE layer with ep_size > 1) is not "
                    "available in ds (DeepSpeed has it, ds does not): leave grad_accum_dtype at its default, or "
                    "use ep_size 1."
                )
            experts = {id(p) for p in moe.expert_params}
            targets = [p for p in model.parameters() if id(p) not in experts]
        reducer = ds_zero.GradientReducer.from_config(
            model if targets is None else targets, cfg, process_group=dp_group
        )

    # 4b. Only now do the optimizer's groups hold the tensors it steps (fp32 masters, ZeRO partitions):
    # a client Adam/AdamW that left the kernel to torch runs on the fused one where those tensors allow.
    ds_optim.prefer_fused_kernel(basic, logger if topology.rank == 0 else None)  # said once, by rank 0

    # 5. The LR schedule steps the *wrapped* optimizer's groups (those are the ones that update weights).
    scheduler = _build_scheduler(cfg, wrapped, lr_scheduler)

    # 6. Activation checkpointing only changes forward, so it is independent of everything above.
    ds_checkpoint.configure(mpu, deepspeed_config=cfg)
    return Parts(
        model,
        dtype,
        wrapped,
        basic,
        scaler,
        reducer,
        scheduler,
        dp_group,
        dp_world_size,
        optimizer is not None,
        evaluation_only=optimizer is None and cfg.optimizer is None,
        moe=moe,
    )


def _grad_accum_dtype(cfg: DSConfig) -> torch.dtype | None:
    """fp32 when ``bf16.grad_accum_dtype`` asks for it; None accumulates in the model dtype."""
    return torch.float32 if cfg.bf16.enabled and cfg.bf16.grad_accum_dtype == "fp32" else None


def _model_parallel_group(mpu: Any) -> Any | None:
    """The mpu's model-parallel group when it has more than one rank (either Megatron spelling)."""
    for prefix in ("get_model_parallel_", "get_tensor_model_parallel_"):
        if mpu is not None and hasattr(mpu, prefix + "group"):
            return getattr(mpu, prefix + "group")() if getattr(mpu, prefix + "world_size")() > 1 else None
    return None


def _broadcast_parameters(model: nn.Module, group: Any, skip: Any = ()) -> None:
    """Every data-parallel rank starts from rank 0's weights (parameters only, as DeepSpeed), except
    ``skip`` (experts, which differ between expert-parallel ranks)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    src = dist.get_global_rank(group, 0) if group is not None else 0
    skipped = {id(p) for p in skip}
    with torch.no_grad():
        for p in model.parameters():
            if id(p) not in skipped:
                dist.broadcast(p.data, src=src, group=group)


def _build_optimizer(cfg: DSConfig, params: list, client: Any, dp_group: Any) -> torch.optim.Optimizer | None:
    """The client's optimizer (or the one its factory builds) when given, else the config's, else None.

    DeepSpeed (and docs/design.md §4) let the client optimizer win; the config's section is then unused,
    which the warning says so that nobody tunes a config that does nothing.
    """
    if client is not None:
        if cfg.optimizer is not None:
            logger.warning(
                "both a client optimizer and a config optimizer (%s) were given: using the client's, as "
                "DeepSpeed does; the config's optimizer section is ignored",
                cfg.optimizer.type,
            )
        return (
            client(params) if callable(client) and not isinstance(client, torch.optim.Optimizer) else client
        )
    if cfg.optimizer is not None:
        # ZeRO offload steps on the CPU partition: Adam becomes CPUAdam there
        offload = cfg.zero_optimization.stage > 0 and cfg.zero_optimization.offload_device in ("cpu", "nvme")
        return ds_optim.optimizer_from_config(
            params, cfg.optimizer, process_group=dp_group, cpu_offload=offload
        )
    return None


def _build_scheduler(cfg: DSConfig, wrapped: Any, client: Any) -> Any:
    """A config scheduler takes precedence over a client one (DeepSpeed); a client one may be a factory."""
    if cfg.scheduler is not None:
        if client is not None:
            logger.warning("both a config scheduler and a client lr_scheduler were given: using the config's")
        return ds_optim.scheduler_from_config(wrapped, cfg.scheduler)
    if callable(client) and not hasattr(client, "step"):
        # torch schedulers need a torch optimizer; the inner one's param groups are the ones that step
        inner = (
            wrapped if isinstance(wrapped, torch.optim.Optimizer) else getattr(wrapped, "optimizer", wrapped)
        )
        return client(inner)
    return client

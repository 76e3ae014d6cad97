"""What ZeRO stages 1 and 2 can be asked to do, read from the config, and the checks on it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ds_config import DSConfig

from ._errors import ZeroAssertionError, ZeroConfigError

__all__ = [
    "DEFAULT_BUCKET_ELEMS",
    "TESTED_OPTIMIZERS",
    "ZeroOptions",
    "check_options",
    "check_step_options",
    "grad_accum_dtype",
]

DEFAULT_BUCKET_ELEMS = 500_000_000
# Optimizers whose update is element-wise, so stepping a flat slice equals stepping whole tensors.
TESTED_OPTIMIZERS = frozenset({"Adam", "AdamW", "SGD", "Adagrad", "CPUAdam", "DeepSpeedCPUAdam", "FusedAdam"})


@dataclass(frozen=True)
class ZeroOptions:
    """The options of :class:`ZeroOptimizer`; field names are the config keys they come from.

    ``clip_grad`` is ``gradient_clipping``, ``allow_untested_optimizer`` is
    ``zero_allow_untested_optimizer``, ``cpu_offload`` is ``offload_optimizer.device == "cpu"`` (or the
    deprecated ``cpu_offload``), ``pin_memory`` is ``offload_optimizer.pin_memory`` and
    ``grad_accum_dtype`` is ``bf16.grad_accum_dtype`` (``torch.float32`` or None for the model dtype).
    """

    stage: int = 1
    reduce_bucket_size: int = DEFAULT_BUCKET_ELEMS
    allgather_bucket_size: int = DEFAULT_BUCKET_ELEMS
    overlap_comm: bool = False
    reduce_scatter: bool = True
    contiguous_gradients: bool = False
    allgather_partitions: bool = True
    cpu_offload: bool = False
    pin_memory: bool = False
    ignore_unused_parameters: bool = True
    clip_grad: float = 0.0
    gradient_predivide_factor: float = 1.0
    prescale_gradients: bool = False
    gradient_average: bool = True  # gradient_allreduce_op "mean"; False: "sum"
    fp32_allreduce: bool = False
    allow_untested_optimizer: bool = False
    grad_accum_dtype: torch.dtype | None = None

    @classmethod
    def from_config(cls, config: DSConfig) -> ZeroOptions:
        """Every key ZeRO reads (``CONFIG_FIELDS`` lists them), from a loaded config."""
        zero = config.zero_optimization
        offload = zero.offload_optimizer
        if zero.offload_device == "nvme":
            raise ZeroConfigError(
                "zero_optimization.offload_optimizer.device 'nvme' is not supported; use 'cpu' or 'none'"
            )
        if config.sparse_gradients and zero.stage in (1, 2):
            raise ZeroConfigError(
                f"sparse_gradients is not supported with zero_optimization.stage {zero.stage}: ZeRO reduces "
                "every gradient as slices of one flat buffer that each rank owns a part of, so an "
                "embedding's touched rows cannot travel alone. Set sparse_gradients to false (the same "
                "values; only the bytes sent differ) or use zero_optimization.stage 0"
            )
        return cls(
            stage=zero.stage,
            reduce_bucket_size=zero.reduce_bucket_size,
            allgather_bucket_size=zero.allgather_bucket_size,
            overlap_comm=zero.overlap_comm,
            reduce_scatter=zero.reduce_scatter,
            contiguous_gradients=zero.contiguous_gradients,
            allgather_partitions=zero.allgather_partitions,
            cpu_offload=zero.offload_device == "cpu",
            pin_memory=offload is not None and offload.pin_memory,
            ignore_unused_parameters=zero.ignore_unused_parameters,
            clip_grad=config.gradient_clipping,
            gradient_predivide_factor=config.gradient_predivide_factor,
            prescale_gradients=config.prescale_gradients,
            gradient_average=config.gradient_allreduce_op == "mean",
            fp32_allreduce=config.fp32_allreduce,
            allow_untested_optimizer=config.zero_allow_untested_optimizer,
            grad_accum_dtype=grad_accum_dtype(config),
        )


def grad_accum_dtype(config: DSConfig) -> torch.dtype | None:
    """``torch.float32`` when ``bf16.grad_accum_dtype`` asks for fp32 accumulation; None: the model dtype."""
    return torch.float32 if config.bf16.enabled and config.bf16.grad_accum_dtype == "fp32" else None


def check_options(optimizer: torch.optim.Optimizer | None, opts: ZeroOptions) -> None:
    """Raise :class:`ZeroConfigError` naming the key to change for what ZeRO cannot honour."""
    if opts.stage not in (1, 2):
        raise ZeroConfigError(
            f"ZeroOptimizer runs ZeRO stages 1 and 2, got stage {opts.stage}: stage 0 is "
            "GradientReducer; stage 3 is not supported"
        )
    if optimizer is None:
        raise ZeroConfigError(f"zero stage {opts.stage} requires an optimizer")
    check_step_options(
        optimizer,
        allow_untested_optimizer=opts.allow_untested_optimizer,
        clip_grad=opts.clip_grad,
        gradient_predivide_factor=opts.gradient_predivide_factor,
        grad_accum_dtype=opts.grad_accum_dtype,
    )
    if opts.fp32_allreduce:
        raise ZeroConfigError(
            "ZeRO does not support 'fp32_allreduce': true; remove the key (ZeRO keeps fp32 "
            "master weights, and reduces in the model dtype)"
        )
    if (
        opts.stage == 2
        and opts.reduce_scatter
        and opts.gradient_average
        and opts.gradient_predivide_factor != 1.0
    ):
        raise ZeroConfigError(
            "gradient_predivide_factor != 1.0 is not yet supported with ZeRO-2 with reduce "
            "scatter enabled: set gradient_predivide_factor to 1.0 or reduce_scatter to false"
        )
    if opts.stage == 2 and opts.reduce_scatter and opts.gradient_average and opts.prescale_gradients:
        raise ZeroConfigError(
            "pre-scale gradients is not yet supported with ZeRO-2 with reduce scatter enabled: "
            "set prescale_gradients to false or reduce_scatter to false"
        )
    for key in ("reduce_bucket_size", "allgather_bucket_size"):
        if int(getattr(opts, key)) < 1:
            raise ZeroConfigError(
                f"zero_optimization.{key} must be a positive element count, got {getattr(opts, key)}"
            )


def check_step_options(
    optimizer: torch.optim.Optimizer,
    *,
    allow_untested_optimizer: bool,
    clip_grad: float,
    gradient_predivide_factor: float,
    grad_accum_dtype: torch.dtype | None,
) -> None:
    """The checks every ZeRO stage (1, 2 and 3) makes on its optimizer and step options."""
    name = type(optimizer).__name__
    elementwise = getattr(optimizer, "ds_zero_elementwise", False)
    if name not in TESTED_OPTIMIZERS and not elementwise and not allow_untested_optimizer:
        raise ZeroAssertionError(  # DeepSpeed asserts here
            f"optimizer {name} is not tested with ZeRO (tested: {', '.join(sorted(TESTED_OPTIMIZERS))}); "
            "ZeRO steps flat slices, which is only correct for element-wise updates. Set "
            '"zero_allow_untested_optimizer": true to use it anyway'
        )
    if grad_accum_dtype not in (None, torch.float32):
        raise ZeroConfigError(
            f"grad_accum_dtype must be torch.float32 or None (the model dtype), got {grad_accum_dtype}"
        )
    if gradient_predivide_factor <= 0:
        raise ZeroConfigError(f"gradient_predivide_factor must be > 0, got {gradient_predivide_factor}")
    if clip_grad < 0:
        raise ZeroConfigError(f"gradient_clipping must be >= 0 (0 disables it), got {clip_grad}")

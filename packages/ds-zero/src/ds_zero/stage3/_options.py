"""The stage-3 options, read from a loaded ``DSConfig`` (the keys listed in ``CONFIG_FIELDS_STAGE3``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from ds_config import DSConfig

from .._aio import AioOptions
from .._options import grad_accum_dtype

__all__ = ["CONFIG_FIELDS_STAGE3", "NvmeOptions", "ParamNvmeOptions", "Stage3Options"]

# dotted DSConfig paths stage 3 reads (merged with ds_zero's CONFIG_FIELDS by the lead)
CONFIG_FIELDS_STAGE3: tuple[str, ...] = (
    "zero_optimization.stage",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.overlap_comm",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_optimizer.pipeline_read",
    "zero_optimization.offload_optimizer.pipeline_write",
    "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_param.pin_memory",
    "aio.block_size",
    "aio.queue_depth",
    "aio.thread_count",
    "aio.intra_op_parallelism",
    "aio.single_submit",
    "aio.overlap_events",
    "zero_optimization.cpu_offload",
    "gradient_clipping",
    "prescale_gradients",
    "gradient_predivide_factor",
    "zero_allow_untested_optimizer",
    "bf16.enabled",
    "bf16.grad_accum_dtype",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_gradients",
)


@dataclass(frozen=True)
class NvmeOptions:
    """An ``offload_optimizer`` (or ``offload_param``) section with ``device: "nvme"``."""

    nvme_path: str
    buffer_count: int = 4
    pin_memory: bool = False
    pipeline_read: bool = False
    pipeline_write: bool = False


@dataclass(frozen=True)
class ParamNvmeOptions:
    """An ``offload_param`` section with ``device: "nvme"`` (DeepSpeed's defaults; see ``_param_swap``)."""

    nvme_path: str
    buffer_count: int = 5
    buffer_size: int = 100_000_000  # elements per buffer: at least the largest parameter partition
    max_in_cpu: int = 1_000_000_000  # partition elements kept in CPU memory (model order), the rest in files
    pin_memory: bool = False


@dataclass(frozen=True)
class Stage3Options:
    """What stage 3 does with the config; the defaults are DeepSpeed 0.19's.

    As in :class:`~ds_zero.ZeroOptions`, the top-level keys have short names: ``clip_grad`` is
    ``gradient_clipping``, ``allow_untested_optimizer`` is ``zero_allow_untested_optimizer`` and
    ``grad_accum_dtype`` is ``bf16.grad_accum_dtype`` (``torch.float32`` or None for the model dtype).
    """

    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    param_persistence_threshold: int = 100_000  # parameters this small stay whole (resident) on every rank
    model_persistence_threshold: int = sys.maxsize  # ... while the resident total stays within this
    prefetch_bucket_size: int = 50_000_000  # elements gathered ahead of use (0: no prefetch)
    max_live_parameters: int = 1_000_000_000  # bound on gathered elements alive at once
    max_reuse_distance: int = 1_000_000_000  # keep a parameter fetched again within this many elements
    sub_group_size: int = 1_000_000_000  # the optimizer steps the partition this many elements at a time
    gather_16bit_weights_on_model_save: bool = False
    offload_optimizer: bool = False  # fp32 masters and optimizer state in CPU memory
    offload_param: bool = False  # parameter partitions in CPU memory
    optimizer_nvme: NvmeOptions | None = None  # masters and optimizer state in files (``_swap``)
    param_nvme: ParamNvmeOptions | None = None  # parameter partitions in files (``_param_swap``)
    aio: AioOptions = AioOptions()  # how the swap files are read and written (``_aio``)
    clip_grad: float = 0.0
    prescale_gradients: bool = False
    gradient_predivide_factor: float = 1.0
    allow_untested_optimizer: bool = False
    grad_accum_dtype: torch.dtype | None = None
    hpz_partition_size: int = 1  # ZeRO++ hpZ: secondary partitions inside groups of this many ranks
    quantized_weights: bool = False  # ZeRO++ qwZ: int8 weights on the gather
    quantized_nontrainable_weights: bool = False  # frozen parameters stored as int8 partitions (``_frozen``)
    quantized_gradients: bool = False  # ZeRO++ qgZ: 4-bit hierarchical gradient reduction

    @classmethod
    def from_config(cls, config: DSConfig) -> Stage3Options:
        """Every key stage 3 reads."""
        zero = config.zero_optimization
        optimizer_device = zero.offload_device
        param_device = zero.offload_param.device if zero.offload_param is not None else "none"
        param_nvme = None
        if param_device == "nvme":
            op = zero.offload_param
            param_nvme = ParamNvmeOptions(
                nvme_path=str(op.nvme_path or ""),
                buffer_count=int(op.buffer_count),
                buffer_size=int(op.buffer_size),
                max_in_cpu=int(op.max_in_cpu),
                pin_memory=bool(op.pin_memory),
            )
        optimizer_nvme = None
        if optimizer_device == "nvme":
            o = zero.offload_optimizer
            optimizer_nvme = NvmeOptions(
                nvme_path=str(o.nvme_path or ""),
                buffer_count=int(o.buffer_count),
                pin_memory=bool(o.pin_memory),
                pipeline_read=bool(o.pipeline_read),
                pipeline_write=bool(o.pipeline_write),
            )
        aio = config.aio
        return cls(
            reduce_bucket_size=int(zero.reduce_bucket_size),
            overlap_comm=bool(zero.overlap_comm),
            param_persistence_threshold=int(zero.stage3_param_persistence_threshold),
            model_persistence_threshold=int(zero.stage3_model_persistence_threshold),
            prefetch_bucket_size=int(zero.stage3_prefetch_bucket_size),
            max_live_parameters=int(zero.stage3_max_live_parameters),
            max_reuse_distance=int(zero.stage3_max_reuse_distance),
            sub_group_size=int(zero.sub_group_size),
            gather_16bit_weights_on_model_save=bool(zero.stage3_gather_16bit_weights_on_model_save),
            offload_optimizer=optimizer_device == "cpu",
            offload_param=param_device == "cpu",
            optimizer_nvme=optimizer_nvme,
            param_nvme=param_nvme,
            aio=AioOptions(
                block_size=int(aio.block_size),
                queue_depth=int(aio.queue_depth),
                # DeepSpeed 0.19 reads intra_op_parallelism, Lightning writes thread_count: the larger wins
                thread_count=max(int(aio.thread_count), int(aio.intra_op_parallelism)),
                single_submit=bool(aio.single_submit),
                overlap_events=bool(aio.overlap_events),
            ),
            clip_grad=float(config.gradient_clipping),
            prescale_gradients=bool(config.prescale_gradients),
            gradient_predivide_factor=float(config.gradient_predivide_factor),
            allow_untested_optimizer=bool(config.zero_allow_untested_optimizer),
            grad_accum_dtype=grad_accum_dtype(config),
            hpz_partition_size=int(zero.zero_hpz_partition_size),
            quantized_weights=bool(zero.zero_quantized_weights),
            quantized_nontrainable_weights=bool(zero.zero_quantized_nontrainable_weights),
            quantized_gradients=bool(zero.zero_quantized_gradients),
        )

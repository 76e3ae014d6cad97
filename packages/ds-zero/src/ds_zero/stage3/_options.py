"""The stage-3 options, read from ds-config's ``ZeroConfig`` (the keys listed in ``CONFIG_FIELDS_STAGE3``)."""

from __future__ import annotations

from dataclasses import dataclass

from ds_config import ZeroConfig

from .._errors import ZeroConfigError

__all__ = ["CONFIG_FIELDS_STAGE3", "Stage3Options"]

# dotted DSConfig paths stage 3 reads (merged with ds_zero's CONFIG_FIELDS by the lead)
CONFIG_FIELDS_STAGE3: tuple[str, ...] = (
    "zero_optimization.stage",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.overlap_comm",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.sub_group_size",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device",
    "zero_optimization.cpu_offload",
)


@dataclass(frozen=True)
class Stage3Options:
    """What stage 3 does with the ``zero_optimization`` section; the defaults are DeepSpeed 0.19's."""

    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    param_persistence_threshold: int = 100_000
    prefetch_bucket_size: int = 50_000_000  # elements gathered ahead of use (0: no prefetch)
    max_live_parameters: int = 1_000_000_000  # bound on gathered elements alive at once
    max_reuse_distance: int = 1_000_000_000  # keep a parameter fetched again within this many elements
    sub_group_size: int = 1_000_000_000  # the optimizer steps the partition this many elements at a time
    gather_16bit_weights_on_model_save: bool = False
    offload_optimizer: bool = False  # fp32 masters and optimizer state in CPU memory
    offload_param: bool = False  # parameter partitions in CPU memory

    @classmethod
    def from_config(cls, zero: ZeroConfig) -> Stage3Options:
        """Read the stage-3 keys; ``nvme`` devices are an error (ds has no NVMe offload)."""
        optimizer_device = zero.offload_device
        param_device = zero.offload_param.device if zero.offload_param is not None else "none"
        for key, device in (("offload_optimizer", optimizer_device), ("offload_param", param_device)):
            if device == "nvme":
                raise ZeroConfigError(
                    f"zero_optimization.{key}.device 'nvme' is not supported by ds; use 'cpu' or 'none'"
                )
        return cls(
            reduce_bucket_size=int(zero.reduce_bucket_size),
            overlap_comm=bool(zero.overlap_comm),
            param_persistence_threshold=int(zero.stage3_param_persistence_threshold),
            prefetch_bucket_size=int(zero.stage3_prefetch_bucket_size),
            max_live_parameters=int(zero.stage3_max_live_parameters),
            max_reuse_distance=int(zero.stage3_max_reuse_distance),
            sub_group_size=int(zero.sub_group_size),
            gather_16bit_weights_on_model_save=bool(zero.stage3_gather_16bit_weights_on_model_save),
            offload_optimizer=optimizer_device == "cpu",
            offload_param=param_device == "cpu",
        )

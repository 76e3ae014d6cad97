"""The dotted DSConfig paths ds-zero reads (``ZeroOptions.from_config`` and ``GradientReducer.from_config``)."""

from __future__ import annotations

__all__ = ["CONFIG_FIELDS"]

CONFIG_FIELDS: tuple[str, ...] = (
    "zero_optimization.stage",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.overlap_comm",
    "zero_optimization.reduce_scatter",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.allgather_partitions",
    "zero_optimization.cpu_offload",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.ignore_unused_parameters",
    "gradient_clipping",
    "gradient_predivide_factor",
    "prescale_gradients",
    "gradient_allreduce_op",
    "fp32_allreduce",
    "sparse_gradients",
    "zero_allow_untested_optimizer",
    "bf16.enabled",
    "bf16.grad_accum_dtype",
    # stage 3 (ds_zero/stage3/_options.py; its CONFIG_FIELDS_STAGE3 lists everything it reads)
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_model_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.offload_param.device",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.sub_group_size",
    # ZeRO++ (stage3/_zeropp.py, _quant.py, _frozen.py): hpZ, int8 weights, int8 frozen partitions, 4-bit gradients
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_optimization.zero_quantized_gradients",
    # NVMe optimizer offload at stage 3 (stage3/_swap.py, _aio.py)
    "zero_optimization.offload_optimizer.nvme_path",
    "zero_optimization.offload_optimizer.buffer_count",
    "zero_optimization.offload_optimizer.pipeline_read",
    "zero_optimization.offload_optimizer.pipeline_write",
    "aio.block_size",
    "aio.queue_depth",
    "aio.thread_count",
    "aio.intra_op_parallelism",
    "aio.single_submit",
    "aio.overlap_events",
    # NVMe parameter offload at stage 3 (stage3/_param_swap.py)
    "zero_optimization.offload_param.nvme_path",
    "zero_optimization.offload_param.buffer_count",
    "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu",
    "zero_optimization.offload_param.pin_memory",
)

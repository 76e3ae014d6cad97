"""The DSConfig keys ds_zero's code reads (``GradientReducer.from_config``, ``ZeroOptimizer.from_config``).

tools/check_config_consumers.py reads this tuple by AST: keep it a tuple of string literals.
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # GradientReducer.from_config (stage 0) takes the whole DSConfig
    "fp32_allreduce",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.overlap_comm",
    # ZeroOptimizer.from_config (stages 1, 2) takes the zero_optimization section
    "zero_optimization.stage",
    "zero_optimization.cpu_offload",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.reduce_scatter",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.allgather_partitions",
    # stage 3 (ds_zero/stage3/_options.py)
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.stage3_gather_fp16_weights_on_model_save",
    "zero_optimization.offload_param.device",
)

"""The DSConfig keys ds_engine's own code reads (tools/checks/check_config_consumers.py reads this by AST).

The engine reads the keys that choose what to assemble and the loop's own keys; every other key is read
by the package the engine hands its section to (each declares its own CONFIG_FIELDS).
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # _initialize / DeepSpeedEngine: the batch triple (derived by ds_config)
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    # _assemble: what is built and how it is wrapped
    "fp16.enabled",
    "bf16.enabled",
    "bf16.grad_accum_dtype",
    "amp.enabled",
    "zero_optimization.stage",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.leaf_module.classes",  # _leaf_config: the leaves marked at initialize
    "zero_optimization.leaf_module.names",
    "zero_optimization.leaf_module.name_suffixes",
    "gradient_clipping",
    # _initialize / _sequence / DeepSpeedEngine.backward: Ulysses groups and gradient scale
    "sequence_parallel_size",
    # DeepSpeedEngine: logging, timers, checkpoints
    "steps_per_print",
    "wall_clock_breakdown",
    "dump_state",
    "checkpoint.tag_validation",
    "zero_optimization.load_from_fp32_weights",
    "zero_optimization.zero_hpz_partition_size",  # the hpZ group (_host_groups.py)
    "zero_optimization.zero_quantized_gradients",  # the host groups of qgZ (_host_groups.py)
    # the monitors (_monitor.py) and the loader initialize() builds
    "csv_monitor.enabled",
    "csv_monitor.output_path",
    "csv_monitor.job_name",
    "tensorboard.enabled",
    "tensorboard.output_path",
    "tensorboard.job_name",
    "dataloader_drop_last",
    # the pipeline engine (_pipe_engine.py)
    "pipeline.activation_checkpoint_interval",
)

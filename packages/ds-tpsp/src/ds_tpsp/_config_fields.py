"""The dotted config paths ds-tpsp's code reads (checked against its real reads by its tests)."""

CONFIG_FIELDS: tuple[str, ...] = (
    "tensor_parallel.autotp_size",
    "tensor_parallel.partition_config.layer_specs",
    "tensor_parallel.partition_config.lm_head_patterns",
    "tensor_parallel.partition_config.strict_mode",
    "tensor_parallel.partition_config.use_default_specs",
    "tensor_parallel.preset_model",
    "tensor_parallel.tp_overlap_comm",
    "tensor_parallel.vocab_parallel_lm_head",
)

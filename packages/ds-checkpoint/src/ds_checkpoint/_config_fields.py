"""The DSConfig keys ds_checkpoint's code reads (tools/checks/check_config_consumers.py reads this by AST).

``checkpoint.tag_validation`` is read by the engine and handed to ``save_state(tag_validation=...)``.
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # activation.ActivationCheckpointingSettings.from_config (via configure(deepspeed_config=...))
    "activation_checkpointing.partition_activations",
    "activation_checkpointing.cpu_checkpointing",
    "activation_checkpointing.contiguous_memory_optimization",
    "activation_checkpointing.number_checkpoints",
    "activation_checkpointing.synchronize_checkpoint_boundary",
    "activation_checkpointing.profile",
)

"""The DSConfig keys ds_precision's code reads (tools/checks/check_config_consumers.py reads this by AST).

``fp16.enabled``, ``bf16.*`` and ``amp.enabled`` are the engine's: they choose whether these are built.
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # loss_scaler_from_config / DynamicLossScaler.from_config / StaticLossScaler.from_config
    "fp16.loss_scale",
    "fp16.initial_scale_power",
    "fp16.loss_scale_window",
    "fp16.hysteresis",
    "fp16.consecutive_hysteresis",
    "fp16.min_loss_scale",
    "fp16.max_overflows_at_min_scale",
    # amp_initialize (every key goes to apex.amp.initialize when apex is importable)
    "amp.opt_level",
    "amp.cast_model_type",
    "amp.patch_torch_functions",
    "amp.keep_batchnorm_fp32",
    "amp.master_weights",
    "amp.loss_scale",
    "amp.cast_model_outputs",
    "amp.num_losses",
    "amp.verbosity",
    "amp.min_loss_scale",
    "amp.max_loss_scale",
)

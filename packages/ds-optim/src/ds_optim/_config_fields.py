"""The DSConfig keys ds_optim's code reads (tools/checks/check_config_consumers.py reads this by AST).

Whether ZeRO offload turns Adam into CPUAdam is the engine's decision (it passes ``cpu_offload``).
"""

CONFIG_FIELDS: tuple[str, ...] = (
    # optimizer_from_config / build_optimizer
    "optimizer.type",
    "optimizer.params",
    # scheduler_from_config / build_scheduler / <Schedule>.from_config
    "scheduler.type",
    "scheduler.params",
)

"""DeepSpeed 0.19.8 config keys that ds refuses, each with the reason the loader gives.

A key listed here (or any key under a listed section) is an error when it appears in a config, with the
reason in the message (strict mode; non-strict loading warns and ignores it), unless its value is DeepSpeed's
default listed in :data:`DEEPSPEED_DEFAULTS` (for a section: every sub-key given at its default): a config
that spells out DeepSpeed's defaults loads, and the key has no effect. ``tools/checks/check_deepspeed_surface.py``
checks that every key DeepSpeed 0.19.8 accepts either exists in :class:`ds_config.DSConfig` (with its effect
or a ``NO_EFFECT`` reason) or is listed here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEEPSPEED_DEFAULTS", "DEEPSPEED_REFUSED", "deepspeed_refusal"]

_NOT_ZERO3 = (
    "a ZeRO stage-3 tuning knob of DeepSpeed's own parameter coordinator, which ds's stage 3 does not have"
)

DEEPSPEED_REFUSED: dict[str, str] = {
    # --- keys that ds refused before this table: kept with their words
    "zero_optimization.legacy_stage1": "legacy stage 1 is not supported (as in DeepSpeed >= 0.5.9); remove it",
    "communication_data_type": "use fp32_allreduce: true for fp32 reductions (the gradient dtype otherwise)",
    # --- features of other axes (their owners give them their effect)
    "sequence_parallel_size": "sequence parallelism (Ulysses) is not in ds",
    "expert_parallel": "DeepSpeed's AutoEP expert parallelism (expert_parallel) is not in ds",
    # --- DeepSpeed features ds does not have
    "checkpoint.load_universal": (
        "DeepSpeed's universal checkpoints are not in ds; ds's own checkpoints load at any world size as they are"
    ),
    "compile": "DeepSpeed's compile section (DeepCompile passes) is not in ds; compile the model with torch.compile",
    "weight_quantization": "DeepSpeed's weight quantization (an inference feature) is not in ds",
    "datastates_ckpt": "DataStates asynchronous checkpointing is not in ds (ds's checkpoint writes are atomic)",
    "timers": "DeepSpeed's throughput timer is not in ds; use wall_clock_breakdown",
    "managed_gradient_accumulation": "DeepSpeed 0.19's managed gradient accumulation mode is not in ds",
    "disable_python_gc": "DeepSpeed's gc control is not in ds; call gc.disable() in the script",
    "graph_harvesting": "CUDA-graph harvesting is not in ds",
    "log_level": "ds logs through the 'ds' logger; set its level with logging.getLogger('ds').setLevel",
    "seq_parallel_communication_data_type": "ds's Ulysses all-to-all runs in the tensors' own dtype (no cast for the exchange)",
    "vocabulary_size": "read only by DeepSpeed's removed MoQ/eigenvalue code; not in ds",
    "quantize_training": "Mixture-of-Quantization is not in ds (DeepSpeed 0.19.8 has removed it too)",
    "compression_training": "DeepSpeed's compression library is not in ds (DeepSpeed 0.19.8 has removed it too)",
    "nebula": "Nebula checkpointing is not in ds (DeepSpeed 0.19.8 has removed it too)",
    "optimizer.legacy_fusion": "DeepSpeed's legacy fp16 fusion switch has no counterpart in ds; remove it",
    "checkpoint.checkpoint_serialization": "ds writes its own pickle-free format (safetensors + JSON) only",
    "checkpoint.parallel_write": "DeepSpeed's pipelined parallel checkpoint writer is not in ds",
    "checkpoint.writer": "DeepSpeed's pluggable checkpoint writers are not in ds (ds writes safetensors atomically)",
    "checkpoint.use_node_local_storage": "ds writes one checkpoint in the save folder; node-local storage is not in ds",
    "data_types.param_dtype": "ds trains parameters in the dtype of fp16/bf16/fp32; a separate param_dtype is not in ds",
    "data_types.buffer_dtype": "ds keeps buffers in the model's precision; buffer_dtype is not in ds",
    "data_types.keep_in_fp32_modules": "keeping chosen modules in fp32 under bf16/fp16 is not in ds",
    "zero_optimization.zenflow": "ZenFlow (stall-free offload) is not in ds",
    "zero_optimization.offload_optimizer.super_offload": "SuperOffload is not in ds",
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": "ds's CPU Adam uses torch's threads (torch.set_num_threads)",
    "zero_optimization.compute_grad_norm": "ds always computes the gradient norm it clips with",
    "zero_optimization.enable_sanity_checks": "DeepSpeed's stage-3 debugging checks are not in ds",
    "zero_optimization.log_trace_cache_warnings": _NOT_ZERO3,
    "zero_optimization.allgather_sequential": _NOT_ZERO3,
    "zero_optimization.stage3_allgather_sequential": _NOT_ZERO3,
    "zero_optimization.use_all_reduce_for_fetch_params": _NOT_ZERO3,
    "zero_optimization.stage3_use_all_reduce_for_fetch_params": _NOT_ZERO3,
    "zero_optimization.module_granularity_threshold": _NOT_ZERO3,
    "zero_optimization.stage3_module_granularity_threshold": _NOT_ZERO3,
    "zero_optimization.memory_efficient_linear": "DeepSpeed's memory-efficient linear of zero.Init is not in ds",
    "zero_optimization.override_module_apply": "ds's zero.Init does not wrap Module.apply",
    "zero_optimization.pipeline_loading_checkpoint": "loading a checkpoint into a pipelined stage-3 model is not in ds",
    "zero_optimization.use_multi_rank_bucket_allreduce": "DeepSpeed's multi-rank bucket all-reduce is not in ds",
    "zero_optimization.save_muon_momentum_buffer_in_memory": "the Muon optimizer is not in ds",
    "zero_optimization.parameter_alignment": "ds aligns its flat partitions itself",
}
"""Dotted DeepSpeed key (a section covers every key under it) -> why ds refuses it."""

DEEPSPEED_DEFAULTS: dict[str, Any] = {
    "communication_data_type": None,
    "managed_gradient_accumulation": True,
    "disable_python_gc": False,
    "graph_harvesting": False,
    "log_level": None,
    "vocabulary_size": None,
    "seq_parallel_communication_data_type": "fp32",
    "sequence_parallel_size": 1,
    "optimizer.legacy_fusion": False,
    "checkpoint.use_node_local_storage": False,
    "data_types.param_dtype": None,
    "data_types.buffer_dtype": None,
    "data_types.keep_in_fp32_modules": "auto",
    "timers": {"throughput": {"enabled": True, "synchronized": True}},
    "compile": {
        "autoep_non_moe": False,
        "debug_log": False,
        "deepcompile": False,
        "double_buffer": True,
        "free_activation": False,
        "free_activation_threshold": 10485760,
        "keep_all_input_tensors": False,
        "keep_int_input_tensors": True,
        "offload_activation": False,
        "offload_activation_pin_memory": True,
        "offload_opt_states": False,
        "offload_parameters": False,
        "passes": None,
        "symmetric_memory": False,
        "sync_after_allgather": False,
        "sync_after_reduce": False,
        "sync_before_allgather": False,
        "sync_before_reduce": False,
    },
    "expert_parallel": {"enabled": False},
    "zero_optimization.zenflow": None,
    "checkpoint.load_universal": False,
    "zero_optimization.offload_optimizer.super_offload": False,
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": 0.8,
    "zero_optimization.compute_grad_norm": True,
    "zero_optimization.enable_sanity_checks": False,
    "zero_optimization.log_trace_cache_warnings": False,
    "zero_optimization.allgather_sequential": False,
    "zero_optimization.stage3_allgather_sequential": False,
    "zero_optimization.use_all_reduce_for_fetch_params": False,
    "zero_optimization.stage3_use_all_reduce_for_fetch_params": False,
    "zero_optimization.module_granularity_threshold": 0,
    "zero_optimization.stage3_module_granularity_threshold": 0,
    "zero_optimization.memory_efficient_linear": True,
    "zero_optimization.override_module_apply": True,
    "zero_optimization.pipeline_loading_checkpoint": False,
    "zero_optimization.use_multi_rank_bucket_allreduce": True,
    "zero_optimization.save_muon_momentum_buffer_in_memory": False,
    "zero_optimization.parameter_alignment": False,
}
"""Refused keys accepted, with no effect, at DeepSpeed 0.19.8's default value (a dict: the sub-keys' defaults)."""


def _at_default(value: Any, default: Any) -> bool:
    if isinstance(default, dict) and isinstance(value, dict):
        return all(k in default and _at_default(v, default[k]) for k, v in value.items())
    if isinstance(value, bool) != isinstance(default, bool):  # true is not 1
        return False
    return value == default


def deepspeed_refusal(path: str, value: Any) -> str | None:
    """Why ds refuses DeepSpeed's key ``path`` (or a section above it) set to ``value``; None where ds has
    no reason for it (a key DeepSpeed lacks too) or the value is DeepSpeed's default (accepted, no effect)."""
    if path in DEEPSPEED_DEFAULTS and _at_default(value, DEEPSPEED_DEFAULTS[path]):
        return None
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        reason = DEEPSPEED_REFUSED.get(".".join(parts[:i]))
        if reason is not None:
            return reason
    return None

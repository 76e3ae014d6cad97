"""Sections of DeepSpeed 0.19's config that configs in the wild carry: monitors, profilers, loggers.

``csv_monitor`` and ``tensorboard`` work (ds-engine writes DeepSpeed's events). The others name features
ds does not have: each is accepted at its disabled value, so a config that only lists DeepSpeed's defaults
loads unchanged, and enabling one is an error that names the feature. Field names are DeepSpeed's keys,
defaults are DeepSpeed 0.19.8's.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ._types import JsonBool, JsonFloat, JsonInt

__all__ = [
    "compat_no_effect",
    "AioConfig",
    "AutotuningConfig",
    "CSVMonitorConfig",
    "CurriculumLearningConfig",
    "DataEfficiencyConfig",
    "EigenvalueConfig",
    "HybridEngineConfig",
    "ProgressiveLayerDropConfig",
    "only_default",
    "CometConfig",
    "CommsLoggerConfig",
    "FlopsProfilerConfig",
    "TensorBoardConfig",
    "TorchAutocastConfig",
    "WandbConfig",
]


class _CompatSection(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class _MonitorOutput(_CompatSection):
    enabled: JsonBool = Field(False, description="Write DeepSpeed's training events (loss, lr, loss scale).")
    output_path: str = Field("", description="Folder under which the job's folder is created.")
    job_name: str = Field("DeepSpeedJobName", description="Folder (inside output_path) the files go to.")


class TensorBoardConfig(_MonitorOutput):
    """``tensorboard``: DeepSpeed's events as TensorBoard scalars, on global rank 0 (needs ``tensorboard``)."""


class CSVMonitorConfig(_MonitorOutput):
    """``csv_monitor``: one CSV file per DeepSpeed event (``step,<name>``), on global rank 0."""


class _Unavailable(_CompatSection):
    """A DeepSpeed feature ds lacks: accepted with ``enabled: false``, an error naming it otherwise."""

    FEATURE: ClassVar[str] = ""

    enabled: JsonBool = Field(False, description="Must stay false: ds does not provide this feature.")

    @model_validator(mode="after")
    def _only_disabled(self) -> Any:
        if self.enabled:
            raise ValueError(
                f"{self.FEATURE} is not available in ds; set enabled: false or remove the section "
                "(ds never ignores an enabled feature)"
            )
        return self


class WandbConfig(_Unavailable):
    """``wandb``: Weights & Biases monitoring (not in ds; use csv_monitor or tensorboard)."""

    FEATURE = "Weights & Biases monitoring (wandb)"
    group: str | None = Field(None, description="DeepSpeed: W&B group.")
    team: str | None = Field(None, description="DeepSpeed: W&B team.")
    project: str = Field("deepspeed", description="DeepSpeed: W&B project.")


class CometConfig(_Unavailable):
    """``comet``: Comet ML monitoring (not in ds; use csv_monitor or tensorboard)."""

    FEATURE = "Comet monitoring (comet)"
    samples_log_interval: JsonInt = Field(100, description="DeepSpeed: samples between Comet logs.")
    project: str | None = Field(None, description="DeepSpeed: Comet project.")
    workspace: str | None = Field(None, description="DeepSpeed: Comet workspace.")
    api_key: str | None = Field(None, description="DeepSpeed: Comet API key.")
    experiment_name: str | None = Field(None, description="DeepSpeed: Comet experiment name.")
    experiment_key: str | None = Field(None, description="DeepSpeed: Comet experiment key.")
    online: JsonBool | None = Field(None, description="DeepSpeed: log online.")
    mode: str | None = Field(None, description="DeepSpeed: get, create or get_or_create.")


class FlopsProfilerConfig(_Unavailable):
    """``flops_profiler``: DeepSpeed's FLOPs profiler (not in ds; use torch.profiler)."""

    FEATURE = "the FLOPs profiler (flops_profiler)"
    recompute_fwd_factor: JsonFloat = Field(0.0, description="DeepSpeed: recomputed forward fraction.")
    profile_step: JsonInt = Field(1, description="DeepSpeed: the step to profile.")
    module_depth: JsonInt = Field(-1, description="DeepSpeed: module depth in the report.")
    top_modules: JsonInt = Field(1, description="DeepSpeed: modules listed in the report.")
    detailed: JsonBool = Field(True, description="DeepSpeed: per-module report.")
    output_file: str | None = Field(None, description="DeepSpeed: report file (stdout when null).")


class CommsLoggerConfig(_Unavailable):
    """``comms_logger``: DeepSpeed's communication logger (not in ds)."""

    FEATURE = "the communication logger (comms_logger)"
    verbose: JsonBool = Field(False, description="DeepSpeed: log every operation.")
    prof_all: JsonBool = Field(True, description="DeepSpeed: profile every operation.")
    debug: JsonBool = Field(False, description="DeepSpeed: add the caller to each record.")
    prof_ops: list[str] = Field(default_factory=list, description="DeepSpeed: operations to profile.")


class TorchAutocastConfig(_Unavailable):
    """``torch_autocast``: DeepSpeed 0.17+'s autocast mode (not in ds; use bf16, fp16 or amp)."""

    FEATURE = "torch autocast mixed precision (torch_autocast)"
    dtype: str | None = Field(None, description="DeepSpeed: autocast dtype.")
    lower_precision_safe_modules: list[str] | None = Field(
        None, description="DeepSpeed: module classes run in the lower precision."
    )


class ProgressiveLayerDropConfig(_Unavailable):
    """``progressive_layer_drop``: not in ds."""

    FEATURE = "progressive layer drop (progressive_layer_drop)"
    theta: JsonFloat = Field(1.0, description="DeepSpeed: final keep probability.")
    gamma: JsonFloat = Field(0.001, description="DeepSpeed: decay rate.")


class _EnabledOnly(_Unavailable):
    """Sections whose many sub-keys matter only when enabled: those sub-keys are passed over unchecked."""

    model_config = ConfigDict(extra="allow", validate_default=True)


class CurriculumLearningConfig(_EnabledOnly):
    """``curriculum_learning``: not in ds (sub-keys are not checked while disabled)."""

    FEATURE = "curriculum learning (curriculum_learning)"


class DataEfficiencyConfig(_EnabledOnly):
    """``data_efficiency``: not in ds (sub-keys are not checked while disabled)."""

    FEATURE = "data efficiency (data_efficiency)"


class EigenvalueConfig(_EnabledOnly):
    """``eigenvalue``: not in ds (sub-keys are not checked while disabled)."""

    FEATURE = "eigenvalue computation (eigenvalue)"


class AutotuningConfig(_EnabledOnly):
    """``autotuning``: not in ds (sub-keys are not checked while disabled)."""

    FEATURE = "the autotuner (autotuning)"


class HybridEngineConfig(_EnabledOnly):
    """``hybrid_engine``: not in ds (sub-keys are not checked while disabled)."""

    FEATURE = "the RLHF hybrid engine (hybrid_engine)"


def only_default(default: Any, feature: str, instead: str = "remove the key") -> AfterValidator:
    """A validator for a DeepSpeed key that ds accepts only at DeepSpeed's default value.

    The message names the feature the other value would ask for, so the user knows what ds lacks, and
    ``instead``: what to do (by default, remove the key).
    """

    def check(value: Any) -> Any:
        if value != default:
            raise ValueError(
                f"{feature} is not available in ds; only the DeepSpeed default {json.dumps(default)} is accepted "
                f"({instead})"
            )
        return value

    return AfterValidator(check)


class AioConfig(_CompatSection):
    """``aio``: the asynchronous I/O of NVMe offload (ZeRO-Infinity): how ds reads and writes the swap files
    (``ds_zero._aio``, a thread pool over ``preadv``/``pwritev`` with O_DIRECT). ``use_gds`` (GPUDirect
    Storage) is accepted only false.
    """

    block_size: JsonInt = Field(
        1048576,
        ge=1,
        description="Bytes per I/O request: a swap read or write is cut into requests of this size.",
    )
    queue_depth: JsonInt = Field(
        8,
        ge=1,
        description="Requests in flight per I/O thread: ds runs thread_count x queue_depth workers, each with "
        "one blocking read or write in the kernel; further requests queue without holding the caller.",
    )
    intra_op_parallelism: JsonInt = Field(
        1,
        ge=1,
        description="I/O worker threads (DeepSpeed 0.19's name); the larger of it and thread_count is used.",
    )
    thread_count: JsonInt = Field(
        1,
        ge=1,
        description="I/O worker threads (the older name, Lightning writes it); the larger of the two is used.",
    )
    single_submit: JsonBool = Field(
        False,
        description="Submit a read or write's requests one at a time (each after the previous completed).",
    )
    overlap_events: JsonBool = Field(
        True,
        description="Return from a read or write at submission and wait later; false: wait at submission.",
    )
    use_gds: Annotated[JsonBool, only_default(False, "GPUDirect Storage (aio.use_gds)")] = Field(
        False, description="Must stay false: ds has no GPUDirect Storage."
    )


def _unavailable_sections() -> dict[str, type[_Unavailable]]:
    return {
        "wandb": WandbConfig,
        "comet": CometConfig,
        "flops_profiler": FlopsProfilerConfig,
        "comms_logger": CommsLoggerConfig,
        "torch_autocast": TorchAutocastConfig,
        "progressive_layer_drop": ProgressiveLayerDropConfig,
        "curriculum_learning": CurriculumLearningConfig,
        "data_efficiency": DataEfficiencyConfig,
        "eigenvalue": EigenvalueConfig,
        "autotuning": AutotuningConfig,
        "hybrid_engine": HybridEngineConfig,
    }


def compat_no_effect() -> dict[str, str]:
    """Dotted key -> why it has no effect in ds, for every DeepSpeed 0.19 key this module accepts only at its
    default or disabled value (for the config reference's no-effect table)."""
    table = {
        f"{section}.{field}": f"{model.FEATURE} is not in ds: the section is accepted only disabled"
        for section, model in _unavailable_sections().items()
        for field in model.model_fields
    }
    table["aio.use_gds"] = "accepted only false: ds has no GPUDirect Storage"
    table.update(
        {
            "fp16.auto_cast": "accepted only false (DeepSpeed's default): ds does not cast the inputs",
            "fp16.fp16_master_weights_and_grads": "accepted only false: ds keeps fp32 master weights",
            "bf16.immediate_grad_update": "accepted only false (DeepSpeed's default)",
            "bf16.check_grad_overflow": "accepted only true (DeepSpeed's default)",
            "bf16.bf16_master_weights_and_grads": "accepted only false: ds keeps fp32 master weights",
            "bf16.bf16_optimizer_states": "accepted only false: ds keeps optimizer state in fp32",
            "disable_allgather": "accepted only false (DeepSpeed's default)",
            "memory_breakdown": "accepted only false (DeepSpeed's default): ds has no memory logging",
            "zero_force_ds_cpu_optimizer": "ds accepts any optimizer with offload; nothing to force",
            "use_data_before_expert_parallelism": "accepted only false: ds has no expert parallelism",
        }
    )
    return table

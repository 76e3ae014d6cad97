"""pydantic v2 models of the whole DeepSpeed JSON config. Field names are the JSON keys.

The descriptions are the documentation: docs/reference/config.md is generated from them.
Cross-key rules live in ``_rules.py`` and run in :func:`ds_config.load_config`; the models
themselves check types and bounds only (plus the two deprecated spellings they normalise).
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ._batch import BatchSizes
from ._compat import (
    AioConfig,
    AutotuningConfig,
    CometConfig,
    CommsLoggerConfig,
    CSVMonitorConfig,
    CurriculumLearningConfig,
    DataEfficiencyConfig,
    EigenvalueConfig,
    FlopsProfilerConfig,
    HybridEngineConfig,
    ProgressiveLayerDropConfig,
    TensorBoardConfig,
    TorchAutocastConfig,
    WandbConfig,
    only_default,
)
from ._data_types import DataTypesConfig
from ._elasticity import ElasticityConfig
from ._errors import DEPRECATED_WITH_REPLACEMENT, ConfigWarning
from ._pipeline import PipelineConfig
from ._tensor_parallel import TensorParallelConfig
from ._types import JsonBool, JsonFloat, JsonInt

__all__ = [
    "ActivationCheckpointingConfig",
    "AmpConfig",
    "BF16Config",
    "BigBirdSparseAttentionConfig",
    "BSLongformerSparseAttentionConfig",
    "CheckpointConfig",
    "DSConfig",
    "DenseSparseAttentionConfig",
    "FP16Config",
    "FixedSparseAttentionConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "LeafModuleConfig",
    "DEFAULT_LEAF_MODULE_CLASSES",
    "OptimizerConfig",
    "SchedulerConfig",
    "SparseAttentionConfig",
    "SparseAttentionModeConfig",
    "VariableSparseAttentionConfig",
    "ZeroConfig",
    "NATIVE_OPTIMIZERS",
    "NATIVE_SCHEDULERS",
    "SPARSE_ATTENTION_MODES",
]

# DeepSpeed lower-cases an optimizer type iff its lower-case form is one of its own (docs/design.md §0).
NATIVE_OPTIMIZERS: dict[str, str] = {
    "adam": "Adam",
    "adamw": "AdamW",
    "lamb": "Lamb",
    "onebitadam": "OneBitAdam",
}
NATIVE_SCHEDULERS: tuple[str, ...] = (
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
    "OneCycle",
    "LRRangeTest",
)
SPARSE_ATTENTION_MODES: tuple[str, ...] = ("dense", "fixed", "variable", "bigbird", "bslongformer")

DEFAULT_BUCKET_SIZE_ELEMS = 500_000_000


class _Section(BaseModel):
    """Base of every section: unknown keys are rejected (load_config reports them with a did-you-mean)."""

    model_config = ConfigDict(extra="forbid", validate_default=True, use_attribute_docstrings=False)


# --------------------------------------------------------------------------------------------- precision
def _finite_number(name: str, value: Any) -> float:
    """DeepSpeed 0.19.8's checks (and words) for a number setting: not a bool, a number or a numeric string,
    finite."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, not bool")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ValueError(f"{name} must be a number") from None
    if not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number (not inf/-inf/nan)")
    return value


class FP16Config(_Section):
    """``fp16``: mixed precision with fp32 master weights and loss scaling (similar to apex amp O2)."""

    enabled: JsonBool = Field(False, description="Enable fp16 mixed-precision training.")
    loss_scale: JsonFloat = Field(
        0.0,
        ge=0,
        description="0 selects dynamic loss scaling; a positive value is used as a fixed (static) loss scale.",
    )
    initial_scale_power: JsonInt = Field(
        32,
        ge=0,
        le=64,
        description="Dynamic loss scaling starts at 2**initial_scale_power (the reference's default, 32).",
    )
    loss_scale_window: JsonInt = Field(
        1000,
        description=(
            "Number of consecutive overflow-free steps after which the dynamic loss scale doubles (>= 1; "
            "not checked while fp16 is off or the scale is static, as DeepSpeed does not use it then)."
        ),
    )
    hysteresis: JsonInt = Field(
        2,
        description=(
            "Delayed shift: how many overflows are tolerated before the dynamic scale is halved (>= 1; not "
            "checked while fp16 is off or the scale is static)."
        ),
    )
    consecutive_hysteresis: JsonBool = Field(
        False,
        description="Refill the hysteresis budget after every overflow-free step, not only after a full window.",
    )
    min_loss_scale: JsonFloat = Field(
        1.0,
        description=(
            "Lower bound of the dynamic loss scale (DeepSpeed's code default 1, not the reference's 1000; > 0, "
            "not checked while fp16 is off or the scale is static)."
        ),
    )
    max_overflows_at_min_scale: JsonInt = Field(
        10,
        ge=1,
        description=(
            "ds extension: after this many consecutive overflows with the scale already at min_loss_scale, "
            "training stops with an error naming the overflowing parameters (each such step is skipped)."
        ),
    )

    # DeepSpeed 0.19 keys that configs carry at their default; any other value asks for a feature ds lacks.
    auto_cast: Annotated[JsonBool, only_default(False, "fp16.auto_cast (casting the inputs to fp16)")] = (
        Field(
            False,
            description="DeepSpeed: cast the inputs to fp16. Only false is accepted: cast them yourself.",
        )
    )
    fp16_master_weights_and_grads: Annotated[
        JsonBool, only_default(False, "fp16.fp16_master_weights_and_grads (fp16 master weights)")
    ] = Field(False, description="DeepSpeed: keep master weights in fp16. Only false: ds keeps fp32 masters.")

    @field_validator("loss_scale", mode="before")
    @classmethod
    def _loss_scale_number(cls, value: Any) -> Any:
        """DeepSpeed 0.19.8's messages for a loss scale that is not a finite number >= 0 (ds also refuses a
        number written as a string, which DeepSpeed converts)."""
        value = _finite_number("fp16.loss_scale", value)
        if value < 0:
            raise ValueError("fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)")
        return value

    @field_validator("min_loss_scale", mode="before")
    @classmethod
    def _min_scale_number(cls, value: Any) -> Any:
        return _finite_number("fp16.min_loss_scale", value)

    @field_validator("loss_scale_window", "hysteresis", mode="before")
    @classmethod
    def _integer(cls, value: Any, info: Any) -> Any:
        name = f"fp16.{info.field_name}"
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, not bool")
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name} must be an integer") from None
        if not isinstance(value, int):
            raise ValueError(f"{name} must be an integer")
        return value

    @model_validator(mode="after")
    def _dynamic_scale_ranges(self) -> Any:
        """The dynamic scaler's settings are checked only where it runs (fp16 on, loss_scale 0): DeepSpeed
        0.19.8 accepts any number there otherwise, and configs carry them with fp16 off."""
        if self.enabled and self.loss_scale == 0:
            for name, low in (("loss_scale_window", 1), ("hysteresis", 1)):
                if getattr(self, name) < low:
                    raise ValueError(
                        f"fp16.{name} must be >= {low} with dynamic loss scaling, got {getattr(self, name)}"
                    )
            if self.min_loss_scale <= 0:
                raise ValueError(
                    f"fp16.min_loss_scale must be > 0 with dynamic loss scaling, got {self.min_loss_scale}"
                )
        return self

    @property
    def dynamic_loss_scale(self) -> bool:
        """True when the loss scale is dynamic (``loss_scale == 0``)."""
        return self.loss_scale == 0


class BF16Config(_Section):
    """``bf16``: bfloat16 training with fp32 master weights and no loss scaling."""

    enabled: JsonBool = Field(False, description="Enable bfloat16 mixed-precision training.")
    grad_accum_dtype: Literal["bf16", "fp32"] = Field(
        "bf16",
        description=(
            "dtype in which gradients are accumulated across micro-steps; 'fp32' keeps an fp32 accumulation "
            "buffer (the name follows DeepSpeed's data_types.grad_accum_dtype)."
        ),
    )
    # DeepSpeed 0.19 keys, accepted at their default only.
    immediate_grad_update: Annotated[
        JsonBool, only_default(False, "bf16.immediate_grad_update (per-micro-step fp32 gradient update)")
    ] = Field(False, description="DeepSpeed 0.19 key; only its default false is accepted.")
    check_grad_overflow: Annotated[
        JsonBool, only_default(True, "bf16.check_grad_overflow: false (DeepSpeed's unchecked bf16 steps)")
    ] = Field(True, description="DeepSpeed 0.19 key; only its default true is accepted.")
    bf16_master_weights_and_grads: Annotated[
        JsonBool, only_default(False, "bf16.bf16_master_weights_and_grads (bf16 master weights)")
    ] = Field(False, description="DeepSpeed 0.19 key; only false: ds keeps fp32 master weights.")
    bf16_optimizer_states: Annotated[
        JsonBool, only_default(False, "bf16.bf16_optimizer_states (bf16 optimizer state)")
    ] = Field(False, description="DeepSpeed 0.19 key; only false: ds keeps optimizer state in fp32.")


# Keyword arguments of apex.amp.initialize that ds knows how to check; anything else is passed through.
class AmpConfig(_Section):
    """``amp``: automatic mixed precision (apex amp when importable, else torch autocast with the same levels).

    Every key other than ``enabled`` is passed to ``apex.amp.initialize``; unknown keys pass through unchecked.
    """

    model_config = ConfigDict(extra="allow", validate_default=True)

    enabled: JsonBool = Field(False, description="Enable automatic mixed precision (amp).")
    opt_level: Literal["O0", "O1", "O2", "O3"] = Field(
        "O1",
        description="amp optimisation level: O0 fp32, O1 patched casts, O2 fp16 model with fp32 master, O3 pure fp16.",
    )
    cast_model_type: str | None = Field(
        None, description="apex: dtype the model is cast to (overrides opt_level)."
    )
    patch_torch_functions: JsonBool | None = Field(
        None, description="apex: patch torch functions to run in fp16 where safe (overrides opt_level)."
    )
    keep_batchnorm_fp32: JsonBool | None = Field(
        None, description="apex: keep batch-norm weights in fp32 (overrides opt_level)."
    )
    master_weights: JsonBool | None = Field(
        None, description="apex: keep fp32 master weights (overrides opt_level)."
    )
    loss_scale: JsonFloat | Literal["dynamic"] | None = Field(
        None, description="apex: a positive fixed loss scale or 'dynamic' (overrides opt_level)."
    )
    cast_model_outputs: str | None = Field(None, description="apex: dtype the model outputs are cast to.")
    num_losses: JsonInt = Field(1, ge=1, description="apex: number of losses scaled separately.")
    verbosity: JsonInt = Field(1, ge=0, le=2, description="apex: 0 silences amp's messages.")
    min_loss_scale: JsonFloat | None = Field(
        None, gt=0, description="apex: lower bound of the dynamic loss scale."
    )
    max_loss_scale: JsonFloat = Field(
        2.0**24, gt=0, description="apex: upper bound of the dynamic loss scale."
    )

    @field_validator("loss_scale")
    @classmethod
    def _positive_loss_scale(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, float) and value <= 0:
            raise ValueError("expected a number > 0 or 'dynamic'")
        return value

    def initialize_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``apex.amp.initialize``: every key but ``enabled``, unset options left out."""
        explicit = {k: v for k, v in self.model_dump(exclude={"enabled"}).items() if v is not None}
        return explicit


# --------------------------------------------------------------------------------------------- ZeRO
class OffloadOptimizerConfig(_Section):
    """``zero_optimization.offload_optimizer``: keep the optimizer state and its step on the CPU (ZeRO-Offload)."""

    device: Literal["none", "cpu", "nvme"] = Field(
        "none",
        description="Where the optimizer state lives: 'none' (the accelerator), 'cpu', or 'nvme' (fp32 masters, "
        "optimizer state and the partition gradients in files under nvme_path; stage 3 only).",
    )
    nvme_path: str | None = Field(
        None,
        description="device 'nvme': directory of the swap files (one folder per rank, emptied at start).",
    )
    buffer_count: JsonInt = Field(
        4,
        ge=1,
        description="device 'nvme': buffers the step streams sub-groups through (master, state and gradient "
        "each).",
    )
    pin_memory: JsonBool = Field(False, description="Use page-locked CPU memory for the offloaded state.")
    pipeline_read: JsonBool = Field(
        False, description="device 'nvme': read the next sub-groups while the current one steps."
    )
    pipeline_write: JsonBool = Field(
        False, description="device 'nvme': leave a sub-group's write in flight while the next ones step."
    )
    fast_init: JsonBool = Field(False, description="NVMe fast initialisation (no effect in ds).")
    ratio: JsonFloat = Field(
        1.0, gt=0, le=1, description="Fraction of the state offloaded; below 1 only with ZeRO stage 3."
    )

    @property
    def pipeline(self) -> bool:
        """DeepSpeed's derived flag: the swap is pipelined when either direction is (``pipeline_read`` or
        ``pipeline_write``)."""
        return self.pipeline_read or self.pipeline_write


class OffloadParamConfig(_Section):
    """``zero_optimization.offload_param``: keep ZeRO-3 parameter partitions in CPU memory or in files (stage 3)."""

    device: Literal["none", "cpu", "nvme"] = Field(
        "none",
        description="Where the parameter partitions live: 'none' (the accelerator), 'cpu', or 'nvme' (files "
        "under nvme_path, ZeRO-Infinity).",
    )
    nvme_path: str | None = Field(
        None,
        description="device 'nvme': the directory of the parameter swap files (one folder per rank under "
        "ds_swap_params/, emptied at start; must exist and be writable, checked at initialize).",
    )
    buffer_count: JsonInt = Field(
        5, ge=1, description="device 'nvme': swap buffers a rank allocates at most (gathers and reads ahead)."
    )
    buffer_size: JsonInt = Field(
        100_000_000,
        ge=1,
        description="device 'nvme': elements per swap buffer; must hold the largest parameter partition in "
        "the files (smaller is an error at initialize naming the parameter).",
    )
    max_in_cpu: JsonInt = Field(
        1_000_000_000,
        ge=0,
        description="device 'nvme': parameter partition elements kept in CPU memory (the first ones in "
        "model order); the rest live in the files.",
    )
    pin_memory: JsonBool = Field(
        False,
        description="device 'nvme': page-lock the swap buffers (where an accelerator makes that possible; a "
        "no-op on a CPU-only machine). Device 'cpu' keeps its partitions pageable.",
    )


DEFAULT_LEAF_MODULE_CLASSES: tuple[str, ...] = (
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
)
"""DeepSpeed 0.19.8's default ``zero_optimization.leaf_module.classes``: Hugging Face's sparse MoE blocks."""


class LeafModuleConfig(_Section):
    """``zero_optimization.leaf_module``: modules stage 3 treats as leaves (DeepSpeed 0.19.8's section): a leaf's
    parameters, its submodules' included, are gathered once for its forward and once for its backward, with no
    hooks inside it. The engine marks them at initialize (the ``_z3_leaf`` flag of
    ``deepspeed.utils.set_z3_leaf_modules``); by default Mixtral's, Qwen2-MoE's and Qwen3-MoE's sparse MoE
    blocks. A name that matches nothing is no error (a warning when it is not a default)."""

    # DeepSpeed's pydantic model refuses null for these lists (not read through dict.get): an error here too
    NULL_REFUSED: ClassVar[frozenset[str]] = frozenset({"classes", "names", "name_suffixes"})

    classes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LEAF_MODULE_CLASSES),
        description="Module classes marked as leaves, by class name or module-qualified name (one string is "
        "a list of one; duplicates dropped). Default: Hugging Face's MixtralSparseMoeBlock, "
        "Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock (module-qualified); [] marks none by class.",
    )
    names: list[str] = Field(
        default_factory=list,
        description="Modules marked as leaves by their name in model.named_modules() (one string is a list of one).",
    )
    name_suffixes: list[str] = Field(
        default_factory=list,
        description="Modules marked as leaves when their name in model.named_modules() ends with one of these.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_string_is_a_list(cls, values: Any) -> Any:
        if values is None:  # DeepSpeed: leaf_module: null is the defaults
            return {}
        if not isinstance(values, dict):
            raise ValueError("leaf_module configuration must be a mapping of fields to values")
        values = dict(values)
        for key in ("classes", "names", "name_suffixes"):
            if isinstance(values.get(key), str):
                values[key] = [values[key]]
        return values

    @model_validator(mode="after")
    def _dedupe(self) -> LeafModuleConfig:
        for key in ("classes", "names", "name_suffixes"):
            object.__setattr__(self, key, list(dict.fromkeys(getattr(self, key))))
        return self


class ZeroConfig(_Section):
    """``zero_optimization``: ZeRO stage 1 (optimizer state), 2 (+ gradients) and 3 (+ parameters) partitioning."""

    # DeepSpeed's field names for the stage-3 keys (its models take either spelling): read as the key
    KEY_ALIASES: ClassVar[dict[str, str]] = {
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "max_reuse_distance": "stage3_max_reuse_distance",
        "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    }

    stage: JsonInt = Field(
        0,
        ge=0,
        le=3,
        description="0 disabled, 1 partitions optimizer state, 2 also gradients, 3 also the parameters.",
    )
    allgather_partitions: JsonBool = Field(
        True,
        description="Gather updated partitions with one all-gather (true) or a broadcast from each owner (false).",
    )
    allgather_bucket_size: JsonInt = Field(
        DEFAULT_BUCKET_SIZE_ELEMS,
        ge=1,
        description="Elements all-gathered at a time; bounds the memory of the parameter all-gather.",
    )
    overlap_comm: JsonBool = Field(False, description="Overlap gradient reduction with the backward pass.")
    reduce_scatter: JsonBool = Field(
        True,
        description="Reduce each gradient slice to its owner only (stage 2) instead of all-reducing buckets.",
    )
    reduce_bucket_size: JsonInt = Field(
        DEFAULT_BUCKET_SIZE_ELEMS,
        ge=1,
        description="Elements reduced at a time; bounds the gradient bucket memory.",
    )
    contiguous_gradients: JsonBool = Field(
        False,
        description="Copy gradients into one contiguous buffer as they are produced (less fragmentation).",
    )
    cpu_offload: JsonBool = Field(
        False, description="Deprecated spelling of offload_optimizer.device = 'cpu'; do not give both."
    )
    offload_optimizer: OffloadOptimizerConfig | None = Field(
        None, description="Offload the optimizer state and step to the CPU (see the offload_optimizer table)."
    )
    cpu_offload_param: JsonBool | None = Field(
        None, description="Deprecated spelling of offload_param.device = 'cpu' (stage 3); do not give both."
    )
    cpu_offload_use_pin_memory: JsonBool | None = Field(
        None,
        description="Deprecated (DeepSpeed 0.19.8 warns and ignores it): set pin_memory in the offload sections.",
    )
    load_from_fp32_weights: JsonBool = Field(
        True,
        description=(
            "On load (stages 1, 2), restore the fp32 master partition from the saved fp32 copy; false rebuilds "
            "it from the loaded (fp16/bf16) weights, keeping the optimizer state. Stage 0 ignores it (DeepSpeed too)."
        ),
    )
    elastic_checkpoint: JsonBool = Field(
        False, description="Accepted for compatibility; ds checkpoints always reshard to any world size."
    )
    ignore_unused_parameters: JsonBool = Field(
        True, description="Do not fail when some parameters get no gradient in a step."
    )
    round_robin_gradients: JsonBool = Field(
        False,
        description="Order gradients so consecutive ones belong to different ranks (stage 2 load balance).",
    )

    # ---- stage 3 (defaults as DeepSpeed 0.19)
    offload_param: OffloadParamConfig | None = Field(
        None,
        description="Stage 3: keep the parameter partitions in CPU memory or on NVMe (see the offload_param table).",
    )
    stage3_prefetch_bucket_size: JsonInt = Field(
        50_000_000,
        ge=0,
        description=(
            "Stage 3: after each module's fetch, up to this many elements of the next modules' parameters "
            "(in the order the first step recorded) are gathered ahead of use, in one collective; 0: no prefetch."
        ),
    )
    stage3_param_persistence_threshold: JsonInt = Field(
        100_000,
        ge=0,
        description=(
            "Stage 3: parameters with at most this many elements stay whole (resident) on every rank for the "
            "whole run: never gathered in forward or backward, refreshed in one collective after each step."
        ),
    )
    stage3_model_persistence_threshold: JsonInt = Field(
        sys.maxsize,
        ge=0,
        description=(
            "Stage 3: at most this many elements in all stay resident; in model order, a parameter under "
            "stage3_param_persistence_threshold that would pass this total is partitioned instead."
        ),
    )
    stage3_max_live_parameters: JsonInt = Field(
        1_000_000_000, ge=0, description="Stage 3: at most this many gathered parameter elements stay alive."
    )
    stage3_max_reuse_distance: JsonInt = Field(
        1_000_000_000,
        ge=0,
        description="Stage 3: keep a gathered parameter if it is used again within this many elements of gathers.",
    )
    sub_group_size: JsonInt = Field(
        1_000_000_000,
        ge=1,
        description=(
            "Stage 3: the optimizer steps the partition in sub-groups of this many elements. With "
            "offload_optimizer.device 'nvme' a sub-group is also what one swap buffer holds: read a view at a "
            "time (each stepped once its bytes are in) and written in one request per tensor (master, moments); "
            "the buffers take buffer_count x sub-group x (12 + gradient bytes) during a step, and larger "
            'sub-groups read and write faster (docs/benchmarks.md "Swap units of sub_group_size"); capped at '
            "2^26 elements there (said in the log)."
        ),
    )
    stage3_gather_16bit_weights_on_model_save: JsonBool = Field(
        False,
        description="Stage 3: save_16bit_model gathers the full 16-bit weights (else it saves nothing).",
    )
    stage3_gather_fp16_weights_on_model_save: JsonBool = Field(
        False,
        description="Deprecated spelling of stage3_gather_16bit_weights_on_model_save; do not give both.",
    )

    leaf_module: LeafModuleConfig = Field(
        default_factory=LeafModuleConfig,
        description="Modules made ZeRO-3 leaves at initialize, by class, name or name suffix (see the "
        "leaf_module table); by default Hugging Face's Mixtral/Qwen2-MoE/Qwen3-MoE sparse MoE blocks.",
    )

    # ---- ZeRO++ (stage 3 across hosts; defaults as DeepSpeed 0.19)
    zero_hpz_partition_size: JsonInt = Field(
        1,
        ge=1,
        description=(
            "Stage 3 hpZ: ranks (consecutive, inside one host) that keep a secondary copy of each gathered "
            "parameter, cut among them; backward gathers from them only, not across hosts. 1: off. Must "
            "divide the data-parallel size and the ranks per host."
        ),
    )
    zero_quantized_weights: JsonBool = Field(
        False,
        description=(
            "Stage 3 qwZ: parameters travel the all-gather as int8, quantized symmetrically per block of "
            "2048 elements with an fp32 scale per block (a quarter of fp32's bytes); every rank computes "
            "with the same dequantized weights, the fp32 masters stay exact."
        ),
    )
    zero_quantized_nontrainable_weights: JsonBool = Field(
        False,
        description=(
            "Stage 3: frozen parameters (requires_grad=False) are kept as int8 partitions, symmetric per "
            "block of 2048 elements with an fp32 scale per block (about a quarter of fp32's bytes, half of "
            "bf16's), all-gathered as int8 and dequantized for forward and backward; trainable parameters "
            "are untouched. Frozen parameters within stage3_param_persistence_threshold stay whole."
        ),
    )
    zero_quantized_gradients: JsonBool = Field(
        False,
        description=(
            "Stage 3 qgZ: gradients reduced by two all-to-alls (inside each host, then across hosts among "
            "the ranks of the same local index) carrying 4-bit values, symmetric per block of 512 elements "
            "with an fp32 scale; each hop sums in fp32. Needs ranks per host from the launcher."
        ),
    )

    @model_validator(mode="after")
    def _old_gather_fp16_name(self) -> ZeroConfig:
        old, new = "stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"
        if old in self.model_fields_set and new in self.model_fields_set:
            raise PydanticCustomError(
                DEPRECATED_WITH_REPLACEMENT,
                f"cannot provide deprecated 'zero_optimization.{old}' and its replacement '{new}' together",
            )
        if self.stage3_gather_fp16_weights_on_model_save:
            self.stage3_gather_16bit_weights_on_model_save = True
        return self

    @model_validator(mode="after")
    def _cpu_offload_to_offload_optimizer(self) -> ZeroConfig:
        if "cpu_offload" in self.model_fields_set and self.offload_optimizer is not None:
            raise PydanticCustomError(
                DEPRECATED_WITH_REPLACEMENT,
                "cannot provide deprecated parameter 'zero_optimization.cpu_offload' and its replacement "
                "'zero_optimization.offload_optimizer' together; keep only offload_optimizer",
            )
        if self.cpu_offload:
            self.offload_optimizer = OffloadOptimizerConfig(device="cpu")
        return self

    @model_validator(mode="after")
    def _cpu_offload_param_to_offload_param(self) -> ZeroConfig:
        if "cpu_offload_param" in self.model_fields_set and "offload_param" in self.model_fields_set:
            raise PydanticCustomError(
                DEPRECATED_WITH_REPLACEMENT,
                "cannot provide deprecated parameter 'zero_optimization.cpu_offload_param' and its replacement "
                "'zero_optimization.offload_param' together; keep only offload_param",
            )
        if self.cpu_offload_param:
            self.offload_param = OffloadParamConfig(device="cpu")
        return self

    @property
    def offload_device(self) -> str:
        """Effective offload device: ``"none"`` or ``"cpu"`` (``cpu_offload: true`` included)."""
        return self.offload_optimizer.device if self.offload_optimizer is not None else "none"


# --------------------------------------------------------------------------------------------- optimizer
class OptimizerConfig(_Section):
    """``optimizer``: the optimizer DeepSpeed builds (Adam, AdamW, Lamb, OneBitAdam or any torch.optim class)."""

    type: str = Field(
        min_length=1,
        description=(
            "Optimizer name: Adam, AdamW, Lamb, OneBitAdam (case-insensitive; stored lower-case like DeepSpeed) "
            "or a torch.optim class name spelled exactly (e.g. SGD)."
        ),
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the optimizer constructor (lr, betas, eps, weight_decay, ...).",
    )

    @field_validator("type", mode="before")
    @classmethod
    def _lower_native_names(cls, value: Any) -> Any:
        if isinstance(value, str) and value.lower() in NATIVE_OPTIMIZERS:
            return value.lower()
        return value


class SchedulerConfig(_Section):
    """``scheduler``: the learning-rate schedule, stepped once per optimizer step."""

    type: str = Field(
        min_length=1,
        description=(
            "Scheduler name: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest, "
            "or a torch.optim.lr_scheduler class name spelled exactly."
        ),
    )
    params: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the scheduler constructor."
    )


# --------------------------------------------------------------------------------------------- activation ckpt
class ActivationCheckpointingConfig(_Section):
    """``activation_checkpointing``: options of ``checkpoint()`` (applied by the user's ``configure`` call)."""

    partition_activations: JsonBool = Field(
        False, description="Store only this model-parallel rank's slice of each checkpointed activation."
    )
    cpu_checkpointing: JsonBool = Field(
        False, description="Move the stored (partitioned) activations to CPU memory."
    )
    contiguous_memory_optimization: JsonBool = Field(
        False,
        description="Copy partitioned activations into preallocated contiguous buffers (needs partition_activations).",
    )
    number_checkpoints: JsonInt | None = Field(
        None, ge=1, description="Number of checkpoints to preallocate for contiguous_memory_optimization."
    )
    synchronize_checkpoint_boundary: JsonBool = Field(
        False,
        description="Synchronize the device at the start and end of each checkpoint's forward and backward.",
    )
    profile: JsonBool = Field(False, description="Time each checkpoint's forward and backward and log it.")


# --------------------------------------------------------------------------------------------- sparse attention
_ATTENTION_DESCRIPTION = (
    "'bidirectional' (BERT-like, tokens see both sides) or 'unidirectional' (autoregressive, lower triangle)."
)


class SparseAttentionModeConfig(_Section):
    """Parameters shared by every sparse-attention mode."""

    block: JsonInt = Field(16, ge=1, description="Block size: the layout is made of block x block tiles.")
    different_layout_per_head: JsonBool = Field(
        False, description="Give each head its own layout (where the mode supports variation)."
    )


class DenseSparseAttentionConfig(SparseAttentionModeConfig):
    """``sparse_attention`` with ``mode: "dense"``: every block present (a reference for the sparse modes)."""

    mode: Literal["dense"] = Field("dense", description="Sparsity structure.")


class FixedSparseAttentionConfig(SparseAttentionModeConfig):
    """``mode: "fixed"`` (the default): local windows plus global representative blocks (Sparse Transformer)."""

    mode: Literal["fixed"] = Field("fixed", description="Sparsity structure.")
    num_local_blocks: JsonInt = Field(4, ge=1, description="Blocks in each local attention window.")
    num_global_blocks: JsonInt = Field(
        1, ge=1, description="Consecutive blocks of a local window that represent it for global attention."
    )
    attention: Literal["unidirectional", "bidirectional"] = Field(
        "bidirectional", description=_ATTENTION_DESCRIPTION
    )
    horizontal_global_attention: JsonBool = Field(
        False, description="Global blocks also attend to every block (bidirectional only)."
    )
    num_different_global_patterns: JsonInt = Field(
        1,
        ge=1,
        description="Number of different global layouts across heads (needs different_layout_per_head).",
    )


class VariableSparseAttentionConfig(SparseAttentionModeConfig):
    """``mode: "variable"``: random, variable-size local windows, and listed global blocks."""

    mode: Literal["variable"] = Field("variable", description="Sparsity structure.")
    num_random_blocks: JsonInt = Field(0, ge=0, description="Random blocks in each block row.")
    local_window_blocks: list[Annotated[JsonInt, Field(ge=1)]] = Field(
        default_factory=lambda: [4],
        min_length=1,
        description="Sizes of the local windows in order; the last size repeats for the rest of the sequence.",
    )
    global_block_indices: list[Annotated[JsonInt, Field(ge=0)]] = Field(
        default_factory=lambda: [0],
        description="Global blocks (attend to and are attended by all); start indices when end indices are given.",
    )
    global_block_end_indices: list[Annotated[JsonInt, Field(ge=1)]] | None = Field(
        None, description="Exclusive end of each global range; same length as global_block_indices."
    )
    attention: Literal["unidirectional", "bidirectional"] = Field(
        "bidirectional", description=_ATTENTION_DESCRIPTION
    )
    horizontal_global_attention: JsonBool = Field(
        False, description="Global blocks also attend to every block (bidirectional only)."
    )


class BigBirdSparseAttentionConfig(SparseAttentionModeConfig):
    """``mode: "bigbird"``: random + sliding-window + global blocks (BigBird)."""

    mode: Literal["bigbird"] = Field("bigbird", description="Sparsity structure.")
    num_random_blocks: JsonInt = Field(
        0, ge=0, description="Random blocks in each block row (config default 0; the class default is 1)."
    )
    num_sliding_window_blocks: JsonInt = Field(3, ge=1, description="Blocks in the sliding local window.")
    num_global_blocks: JsonInt = Field(
        1, ge=1, description="Leading blocks that attend to and are seen by all."
    )
    attention: Literal["unidirectional", "bidirectional"] = Field(
        "bidirectional",
        description=_ATTENTION_DESCRIPTION + " (read here as by V14's class; its parser ignored it)",
    )


class BSLongformerSparseAttentionConfig(SparseAttentionModeConfig):
    """``mode: "bslongformer"``: sliding window + global blocks (block-sparse Longformer)."""

    mode: Literal["bslongformer"] = Field("bslongformer", description="Sparsity structure.")
    num_sliding_window_blocks: JsonInt = Field(3, ge=1, description="Blocks in the sliding local window.")
    global_block_indices: list[Annotated[JsonInt, Field(ge=0)]] = Field(
        default_factory=lambda: [0],
        description="Global blocks (full rows and columns); start indices when end indices are given.",
    )
    global_block_end_indices: list[Annotated[JsonInt, Field(ge=1)]] | None = Field(
        None, description="Exclusive end of each global range; same length as global_block_indices."
    )
    attention: Literal["unidirectional", "bidirectional"] = Field(
        "bidirectional",
        description=_ATTENTION_DESCRIPTION + " (read here as by V14's class; its parser ignored it)",
    )


SPARSE_ATTENTION_MODELS: dict[str, type[SparseAttentionModeConfig]] = {
    "dense": DenseSparseAttentionConfig,
    "fixed": FixedSparseAttentionConfig,
    "variable": VariableSparseAttentionConfig,
    "bigbird": BigBirdSparseAttentionConfig,
    "bslongformer": BSLongformerSparseAttentionConfig,
}


def _sparse_mode_of(value: Any) -> str | None:
    # A missing mode means "fixed", as in DeepSpeed's parser.
    if isinstance(value, dict):
        mode = value.get("mode", "fixed")
        return mode if isinstance(mode, str) else None
    return getattr(value, "mode", None)


SparseAttentionConfig = Annotated[
    Annotated[DenseSparseAttentionConfig, Tag("dense")]
    | Annotated[FixedSparseAttentionConfig, Tag("fixed")]
    | Annotated[VariableSparseAttentionConfig, Tag("variable")]
    | Annotated[BigBirdSparseAttentionConfig, Tag("bigbird")]
    | Annotated[BSLongformerSparseAttentionConfig, Tag("bslongformer")],
    Discriminator(
        _sparse_mode_of,
        custom_error_type="invalid_sparse_mode",
        custom_error_message="mode must be one of 'dense', 'fixed', 'variable', 'bigbird', 'bslongformer'",
    ),
]
"""``sparse_attention``: one model per ``mode`` (dense, fixed, variable, bigbird, bslongformer)."""


# --------------------------------------------------------------------------------------------- checkpoint
class CheckpointConfig(_Section):
    """``checkpoint``: options of save_checkpoint / load_checkpoint."""

    tag_validation: Literal["Warn", "Ignore", "Fail"] = Field(
        "Warn",
        description="Check that every rank saves under the same tag: Warn, Ignore or Fail (case-insensitive).",
    )

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _case_insensitive(cls, value: Any) -> Any:
        if isinstance(value, str) and value.capitalize() in ("Warn", "Ignore", "Fail"):
            return value.capitalize()
        return value


# steps_per_print: inf (never) is stored as this int: no step count reaches it
STEPS_NEVER = 2**63 - 1


# --------------------------------------------------------------------------------------------- whole config
class DSConfig(_Section):
    """The whole DeepSpeed config. Build it with :func:`ds_config.load_config`, which also derives the batch
    sizes for a world size and applies the cross-key rules; after that the three batch fields are all set."""

    # older spellings DeepSpeed still reads: read as the key
    KEY_ALIASES: ClassVar[dict[str, str]] = {"bfloat16": "bf16"}

    train_batch_size: JsonInt | None = Field(
        None,
        ge=1,
        description=(
            "Samples per optimizer step over all ranks = micro batch x gradient accumulation steps x world size. "
            "Give it or train_micro_batch_size_per_gpu."
        ),
    )
    train_micro_batch_size_per_gpu: JsonInt | None = Field(
        None, ge=1, description="Samples one rank processes in one forward/backward (derived when absent)."
    )
    gradient_accumulation_steps: JsonInt | None = Field(
        None,
        ge=1,
        description="Micro-steps whose gradients are accumulated before each optimizer step (derived).",
    )
    optimizer: OptimizerConfig | None = Field(
        None, description="Optimizer built by the engine (none: client's)."
    )
    scheduler: SchedulerConfig | None = Field(None, description="Learning-rate schedule built by the engine.")
    fp32_allreduce: JsonBool = Field(
        False, description="All-reduce gradients in fp32 (cast up, reduce, cast back)."
    )
    prescale_gradients: JsonBool = Field(
        False, description="Divide gradients by the world size before the all-reduce instead of after it."
    )
    gradient_predivide_factor: JsonFloat = Field(
        1.0, gt=0, description="Divide gradients by this before the all-reduce and by world/factor after it."
    )
    sparse_gradients: JsonBool = Field(
        False, description="Reduce torch.nn.Embedding gradients sparsely (only the rows that were used)."
    )
    fp16: FP16Config = Field(
        default_factory=FP16Config, description="fp16 mixed precision with loss scaling."
    )
    bf16: BF16Config = Field(default_factory=BF16Config, description="bfloat16 mixed precision.")
    amp: AmpConfig = Field(
        default_factory=AmpConfig, description="Automatic mixed precision (apex amp levels)."
    )
    gradient_clipping: JsonFloat = Field(
        0.0, ge=0, description="Clip gradients to this global L2 norm; 0 disables clipping."
    )
    gradient_allreduce_op: Literal["mean", "sum"] = Field(
        "mean",
        description=(
            "How data-parallel gradients are combined (case-insensitive): 'mean' averages them; 'sum' adds "
            "them, with no pre- or post-scaling (prescale_gradients and gradient_predivide_factor then do "
            "nothing), at ZeRO stages 0-2; DeepSpeed 0.19.8 refuses 'sum' at stage 3, and so does ds."
        ),
    )

    @field_validator("gradient_allreduce_op", mode="before")
    @classmethod
    def _lower_case_op(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    pipeline: PipelineConfig = Field(
        default_factory=PipelineConfig, description="The pipeline engine's settings (a PipelineModule's)."
    )
    elasticity: ElasticityConfig = Field(
        default_factory=ElasticityConfig, description="Elastic batch sizing."
    )
    zero_optimization: ZeroConfig = Field(
        default_factory=ZeroConfig,
        description="ZeRO partitioning (the deprecated boolean form true/false means stage 1/0).",
    )
    allgather_size: JsonInt = Field(
        DEFAULT_BUCKET_SIZE_ELEMS,
        ge=1,
        description="Deprecated: all-gather bucket size read only with the boolean form zero_optimization: true.",
    )
    zero_allow_untested_optimizer: JsonBool = Field(
        False, description="Allow ZeRO with an optimizer other than Adam/AdamW (untested combinations)."
    )
    steps_per_print: JsonInt = Field(10, ge=1, description="Log progress every this many optimizer steps.")
    sequence_parallel_size: JsonInt = Field(
        1,
        ge=1,
        description="DeepSpeed-Ulysses sequence-parallel degree: each sequence is split over this many consecutive ranks; the data-parallel size (and the batch math) is the world size divided by it, and ZeRO reduces and partitions over data x sequence.",
    )  # noqa: E501

    @field_validator("steps_per_print", mode="before")
    @classmethod
    def _never_print(cls, value: Any) -> Any:
        """``float("inf")`` (Accelerate's way to silence DeepSpeed's progress log) means never: the largest int."""
        if isinstance(value, float) and value == float("inf"):
            return STEPS_NEVER
        return value

    wall_clock_breakdown: JsonBool = Field(
        False, description="Time the forward, backward and step phases and log them."
    )
    dump_state: JsonBool = Field(False, description="Print the engine's state once after initialisation.")
    activation_checkpointing: ActivationCheckpointingConfig = Field(
        default_factory=ActivationCheckpointingConfig, description="Activation checkpointing options."
    )
    sparse_attention: SparseAttentionConfig | None = Field(
        None, description="Block-sparse attention layout, one parameter set per mode (none: not used)."
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpoint options.")
    data_types: DataTypesConfig = Field(
        default_factory=DataTypesConfig, description="Gradient accumulation dtype."
    )
    tensor_parallel: TensorParallelConfig = Field(
        default_factory=TensorParallelConfig, description="AutoTP training."
    )
    dataloader_drop_last: JsonBool = Field(
        False, description="The loader initialize() builds drops the last incomplete micro-batch."
    )

    # ---- DeepSpeed 0.19 sections: monitors ds provides, and features it lacks (accepted disabled only)
    tensorboard: TensorBoardConfig = Field(
        default_factory=TensorBoardConfig, description="TensorBoard events."
    )
    csv_monitor: CSVMonitorConfig = Field(default_factory=CSVMonitorConfig, description="CSV event files.")
    aio: AioConfig = Field(
        default_factory=AioConfig, description="NVMe offload I/O: how swap files are read and written."
    )
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="Not in ds: disabled only.")
    comet: CometConfig = Field(default_factory=CometConfig, description="Not in ds: disabled only.")
    flops_profiler: FlopsProfilerConfig = Field(
        default_factory=FlopsProfilerConfig, description="Not in ds: disabled only."
    )
    comms_logger: CommsLoggerConfig = Field(
        default_factory=CommsLoggerConfig, description="Not in ds: disabled only."
    )
    torch_autocast: TorchAutocastConfig = Field(
        default_factory=TorchAutocastConfig, description="Not in ds: disabled only."
    )
    progressive_layer_drop: ProgressiveLayerDropConfig = Field(
        default_factory=ProgressiveLayerDropConfig, description="Not in ds: disabled only."
    )
    curriculum_learning: CurriculumLearningConfig = Field(
        default_factory=CurriculumLearningConfig, description="Not in ds: disabled only."
    )
    data_efficiency: DataEfficiencyConfig = Field(
        default_factory=DataEfficiencyConfig, description="Not in ds: disabled only."
    )
    eigenvalue: EigenvalueConfig = Field(
        default_factory=EigenvalueConfig, description="Not in ds: disabled only."
    )
    autotuning: AutotuningConfig = Field(
        default_factory=AutotuningConfig, description="Not in ds: disabled only."
    )
    hybrid_engine: HybridEngineConfig = Field(
        default_factory=HybridEngineConfig, description="Not in ds: disabled only."
    )
    disable_allgather: Annotated[JsonBool, only_default(False, "disable_allgather (broadcast-only ZeRO)")] = (
        Field(False, description="DeepSpeed key; only its default false is accepted.")
    )
    memory_breakdown: Annotated[JsonBool, only_default(False, "memory_breakdown (memory logging)")] = Field(
        False, description="DeepSpeed key; only its default false is accepted."
    )
    zero_force_ds_cpu_optimizer: JsonBool = Field(
        True, description="DeepSpeed key; ds accepts any optimizer with offload, so it has no effect."
    )
    use_data_before_expert_parallelism: Annotated[
        JsonBool, only_default(False, "use_data_before_expert_parallelism (expert parallelism)")
    ] = Field(False, description="DeepSpeed MoE key; only its default false is accepted.")

    _batch: BatchSizes | None = PrivateAttr(None)

    @property
    def batch(self) -> BatchSizes:
        """The derived batch sizes and the world size they were derived for (set by ``load_config``)."""
        if self._batch is None:
            raise AttributeError("batch sizes are derived by ds_config.load_config(..., world_size=N)")
        return self._batch

    @model_validator(mode="before")
    @classmethod
    def _boolean_zero_form(cls, data: Any) -> Any:
        # DeepSpeed's original form "zero_optimization": true meant stage 1 with the top-level allgather_size.
        if isinstance(data, dict) and isinstance(data.get("zero_optimization"), bool):
            data = dict(data)
            enabled = data["zero_optimization"]
            warnings.warn(
                f"zero_optimization: {str(enabled).lower()} is deprecated; write "
                f'"zero_optimization": {{"stage": {int(enabled)}}}',
                ConfigWarning,
                stacklevel=2,
            )
            data["zero_optimization"] = (
                {"stage": 1, "allgather_bucket_size": data.pop("allgather_size", DEFAULT_BUCKET_SIZE_ELEMS)}
                if enabled
                else {"stage": 0}
            )
        return data

    @property
    def precision(self) -> str:
        """The effective training precision: ``"fp16"``, ``"bf16"``, ``"amp"`` or ``"fp32"``."""
        if self.fp16.enabled:
            return "fp16"
        if self.bf16.enabled:
            return "bf16"
        if self.amp.enabled:
            return "amp"
        return "fp32"

"""``tensor_parallel``: AutoTP training (DeepSpeed 0.19.8's ``TPTrainingConfig`` keys and defaults).

ds-tpsp shards the model's linear layers over the tensor-parallel group; ds-engine builds that group
(the ``tensor`` axis of its one topology) from ``autotp_size``. Keys DeepSpeed only reads for inference,
or that hold Python objects, are accepted at their defaults (an error names them otherwise).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ._compat import only_default
from ._types import JsonBool, JsonInt

__all__ = ["LayerSpecConfig", "PartitionConfig", "TensorParallelConfig", "TPGroupConfig", "TP_PRESETS"]

# the presets DeepSpeed 0.19.8 names (AutoTPPresets)
TP_PRESETS = ("llama", "bloom", "chatglm", "mixtral", "deepseek_v2", "qwen2", "phi3")

# the precisions ``dtype`` may name, in DeepSpeed's torch spellings and the config's short ones
_DTYPES = {
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}  # fmt: skip

_GROUP = "remove it: ds builds the tensor-parallel group from autotp_size (its topology's tensor axis)"


class _TPSection(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class LayerSpecConfig(_TPSection):
    """One entry of ``partition_config.layer_specs``: which weights (regular expressions matched against the
    parameter name, ``model.layers.0.self_attn.q_proj.weight``) are split how."""

    patterns: list[str] = Field(
        ..., min_length=1, description="Regular expressions (re.match) on the weight's parameter name."
    )
    partition_type: Literal["column", "row", "skip"] = Field(
        "column",
        description=(
            "column: split the output features (all-reduce of the input gradient in backward); row: split the "
            "input features (all-reduce of the output in forward); skip: keep the layer whole."
        ),
    )
    shape: list[Any] | None = Field(
        None,
        description=(
            "The weight's logical shape: a count at the partition dimension ([2, -1]: two fused sub-weights "
            "such as gate_up_proj) or a list of sub-weight sizes ([[q, k, v], -1]); each sub-weight is split "
            "on its own."
        ),
    )
    partition_dim: JsonInt | None = Field(
        None, ge=0, le=1, description="The dimension split (default 0 for column, 1 for row)."
    )
    model_types: list[str] | None = Field(
        None, description="Apply only to models whose config.model_type is one of these."
    )
    gather_output: JsonBool = Field(
        False, description="Column only: all-gather the output so every rank gets the whole of it."
    )
    grad_allreduce: JsonBool = Field(
        False,
        description="Skip only: the weight stays whole but its gradient is summed over the tensor-parallel group.",
    )

    @field_validator("partition_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class PartitionConfig(_TPSection):
    """``tensor_parallel.partition_config``: custom sharding rules, used instead of the model's own plan."""

    use_default_specs: JsonBool = Field(
        True,
        description="With preset_model: the preset's rules follow these (merged); false: these rules alone.",
    )
    layer_specs: list[LayerSpecConfig] = Field(
        default_factory=list, description="Sharding rules; the first whose pattern matches a weight wins."
    )
    tp_size: JsonInt = Field(1, ge=1, description="Replaced by autotp_size (as in DeepSpeed).")
    embedding_partition_dim: JsonInt = Field(1, description="DeepSpeed 0.19.8 reads it nowhere.")
    lm_head_patterns: list[str] = Field(
        default_factory=lambda: ["lm_head", "embed_out"],
        description="Module names (last component) that are the language-model head, for vocab_parallel_lm_head.",
    )
    strict_mode: JsonBool = Field(
        False, description="An nn.Linear that no layer spec matches is an error instead of staying whole."
    )


class TPGroupConfig(_TPSection):
    """``tensor_parallel.tp`` (also spelled ``tensor_parallel.tensor_parallel``)."""

    tp_size: JsonInt = Field(1, ge=1, description="1 or the same as autotp_size (DeepSpeed's check).")
    tp_grain_size: JsonInt = Field(1, ge=1, description="Uneven-split granularity; not used in training.")
    mpu: Annotated[Any, only_default(None, "tensor_parallel.tp.mpu (an object in the config)", _GROUP)] = (
        Field(None, description="Accepted only null: ds builds the tensor-parallel group from autotp_size.")
    )
    tp_group: Annotated[
        Any, only_default(None, "tensor_parallel.tp.tp_group (a group in the config)", _GROUP)
    ] = Field(None, description="Accepted only null: ds builds the tensor-parallel group from autotp_size.")


class TensorParallelConfig(_TPSection):
    """``tensor_parallel``: AutoTP training. ``autotp_size`` > 1 shards the linear layers of a Hugging Face
    decoder (attention q/k/v and MLP up/gate column-wise, o and down row-wise, the LM head column-wise with its
    output gathered; embeddings whole) over that many consecutive ranks; the rest of the world is the
    data-parallel axis (ZeRO partitions over it)."""

    KEY_ALIASES: ClassVar[dict[str, str]] = {
        "tensor_parallel": "tp",
        "kernel_inject": "replace_with_kernel_inject",
    }

    autotp_size: JsonInt = Field(
        0, ge=0, description="Tensor-parallel degree; 0 or 1: off. It must divide the world size."
    )
    tp_overlap_comm: JsonBool = Field(
        False,
        description=(
            "In a column-parallel layer's backward, launch the input gradient's all-reduce asynchronously and "
            "compute the weight gradient while it runs."
        ),
    )
    vocab_parallel_lm_head: JsonBool | None = Field(
        None,
        description=(
            "true: the LM head (an nn.Linear named by partition_config.lm_head_patterns) is split over the "
            "vocabulary with its logits left split, the model's loss_function computes the causal-LM loss "
            "vocab-parallel and an embedding tied to the head looks up the same shard; null: so when the model's "
            "Hugging Face plan shards a tied embedding (embedding_rowwise), else as false; false: the head's "
            "logits are gathered."
        ),
    )
    vocab_parallel_ce_backend: Annotated[
        Literal["torch", "liger"],
        only_default("torch", "vocab_parallel_ce_backend: liger (Liger kernels)", "remove the key"),
    ] = Field("torch", description="The vocab-parallel cross entropy's implementation; only torch in ds.")
    tp: TPGroupConfig = Field(
        default_factory=TPGroupConfig, description="The tensor-parallel group's settings."
    )
    dtype: str = Field(
        "fp16", description="The dtype tp_model_init records; DeepSpeed's training engine does not read it."
    )
    injection_policy_tuple: Annotated[
        Any, only_default(None, "tensor_parallel.injection_policy_tuple (inference injection policies)")
    ] = Field(None, description="Accepted only null (DeepSpeed sets it internally for inference).")
    partition_config: PartitionConfig | None = Field(
        None, description="Custom sharding rules (layer_specs), used instead of the model's own plan."
    )
    preset_model: Literal[TP_PRESETS] | None = Field(  # type: ignore[valid-type]
        None, description="Built-in sharding rules for an architecture: " + ", ".join(TP_PRESETS) + "."
    )
    keep_module_on_host: JsonBool = Field(
        False, description="Keep loaded weights on the host while sharding (a device-memory saving)."
    )
    replace_with_kernel_inject: Annotated[
        JsonBool, only_default(False, "tensor_parallel.replace_with_kernel_inject (inference kernels)")
    ] = Field(False, description="Inference kernel injection; accepted only false.")

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_name(cls, value: Any) -> Any:
        name = str(value).removeprefix("torch.").lower()  # a torch.dtype given through tp_model_init
        if name not in _DTYPES:
            raise ValueError(f"unknown dtype {value!r}; use one of fp16, bf16, fp32")
        return _DTYPES[name]

    @field_validator("preset_model", mode="before")
    @classmethod
    def _lower_preset(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

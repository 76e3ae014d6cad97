"""``pipeline``: DeepSpeed's pipeline-engine settings (the section is passed through as written: ``"auto"``
is a real value of ``stages``). Most of it is read by nothing in DeepSpeed 0.19.8 either; ds_config's
NO_EFFECT says why for each key that changes nothing."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ._types import JsonBool, JsonInt

__all__ = ["PipelineConfig"]


class PipelineConfig(BaseModel):
    """``pipeline``: settings of the pipeline engine ``initialize()`` builds for a PipelineModule."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    stages: JsonInt | Literal["auto"] = Field(
        "auto",
        description="DeepSpeed's pipeline degree key; the PipelineModule's num_stages / topology decide.",
    )
    partition: str = Field(
        "best", description="DeepSpeed's partition key; the PipelineModule's partition_method decides."
    )
    seed_layers: JsonBool = Field(
        False, description="DeepSpeed's per-layer seeding key; the PipelineModule's seed_layers decides."
    )
    activation_checkpoint_interval: JsonInt = Field(
        0,
        ge=0,
        description=(
            "When positive, the engine sets the PipelineModule's activation_checkpoint_interval to it: every "
            "run of that many layers is recomputed in backward instead of keeping its activations."
        ),
    )
    pipe_partitioned: JsonBool = Field(
        True, description="Partition activations sent between stages across tensor-parallel ranks."
    )
    grad_partitioned: JsonBool = Field(
        True, description="Partition gradients sent between stages across tensor-parallel ranks."
    )
    use_reentrant: JsonBool | None = Field(
        None,
        description="DeepSpeed: false switches the pipeline's activation checkpointing to non-reentrant.",
    )

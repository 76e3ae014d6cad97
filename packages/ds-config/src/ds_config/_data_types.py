"""``data_types``: DeepSpeed 0.19's section of data types (its ``grad_accum_dtype``).

``grad_accum_dtype`` is the dtype gradients are accumulated in across micro-steps. ds gives it its effect
through ``bf16.grad_accum_dtype`` (ds's own key for the same thing): with bf16 training, ``"fp32"`` keeps
an fp32 accumulation buffer; the model's own dtype changes nothing. Other mixes (fp16 or fp32 weights with
another accumulation dtype) are refused, as DeepSpeed 0.19.8 refuses them without ZeRO
("unsupported mix of model_dtype and grad_accum_dtype"); under ZeRO DeepSpeed ignores them silently.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DataTypesConfig", "canonical_dtype"]

# DeepSpeed's DtypeEnum spellings of the three training dtypes
_SPELLINGS = {
    "fp32": ("fp32", "float32", "float", "torch.float32", "torch.float"),
    "fp16": ("fp16", "float16", "half", "torch.float16", "torch.half"),
    "bf16": ("bf16", "bfloat16", "bfloat", "torch.bfloat16"),
}


def canonical_dtype(value: Any) -> str:
    """``"fp32"``, ``"fp16"`` or ``"bf16"`` for any of DeepSpeed's spellings; ValueError otherwise."""
    for name, spellings in _SPELLINGS.items():
        if isinstance(value, str) and value.lower() in spellings:
            return name
    known = ", ".join(s for group in _SPELLINGS.values() for s in group)
    raise ValueError(f"{value!r} is not a dtype DeepSpeed takes here (one of {known})")


class DataTypesConfig(BaseModel):
    """``data_types``: gradient accumulation dtype (DeepSpeed 0.19's section)."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    grad_accum_dtype: str | None = Field(
        None,
        description=(
            "dtype gradients are accumulated in across micro-steps (DeepSpeed's spellings: fp32, fp16, bf16, "
            "float32, ...); null: the model's dtype. With bf16 training 'fp32' keeps an fp32 accumulation "
            "buffer (the same as bf16.grad_accum_dtype: fp32); another mix with the model's dtype is refused."
        ),
    )

    @field_validator("grad_accum_dtype")
    @classmethod
    def _spelling(cls, value: Any) -> Any:
        return None if value is None else canonical_dtype(value)

"""Which weights are split how: layer specs from the config, a preset, the model's own Hugging Face plan,
or (for a model with none) the names of Hugging Face decoders' projections. DeepSpeed 0.19.8's order:
``partition_config`` / ``preset_model`` first, then the model's ``tp_plan``, then the names."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch import nn

__all__ = ["Spec", "PRESETS", "resolve_specs", "find_spec"]

_R, _C, _S = "row", "column", "skip"


@dataclass(frozen=True)
class Spec:
    """One rule: weights whose name matches one of ``patterns`` (re.match) are split as ``kind``."""

    patterns: tuple[str, ...]
    kind: str  # "column" | "row" | "skip"
    shape: tuple[Any, ...] | None = None
    partition_dim: int | None = None
    model_types: tuple[str, ...] | None = None
    gather_output: bool = False
    grad_allreduce: bool = False

    def matches(self, name: str, model_type: str | None) -> bool:
        if self.model_types and (model_type or "").lower() not in {m.lower() for m in self.model_types}:
            return False
        return any(re.match(p, name) for p in self.patterns)


def _p(kind: str, *patterns: str, shape: tuple | None = None) -> Spec:
    return Spec(tuple(patterns), kind, shape=shape)


_LLAMA = (
    _p(_R, r".*\.self_attn\.o_proj\.weight$"),
    _p(_C, r".*\.self_attn\.[qkv]_proj\.weight$"),
    _p(_R, r".*\.mlp\.down_proj\.weight$"),
    _p(_C, r".*\.mlp\.(up|gate)_proj\.weight$"),
)
# DeepSpeed 0.19.8's AutoTPPresets, rule for rule
PRESETS: dict[str, tuple[Spec, ...]] = {
    "llama": _LLAMA,
    "qwen2": _LLAMA,
    "bloom": (
        _p(_R, r".*\.self_attention\.dense\.weight$"),
        _p(_C, r".*\.self_attention\.query_key_value\.weight$"),
        _p(_R, r".*\.mlp\.dense_4h_to_h\.weight$"),
        _p(_C, r".*\.mlp\.dense_h_to_4h\.weight$"),
    ),
    "chatglm": (
        _p(_R, r".*\.self_attention\.dense\.weight$"),
        _p(_C, r".*\.self_attention\.query_key_value\.weight$", shape=(3, -1)),
        _p(_R, r".*\.mlp\.dense_4h_to_h\.weight$"),
        _p(_C, r".*\.mlp\.dense_h_to_4h\.weight$", shape=(2, -1)),
    ),
    "mixtral": (
        _p(_R, r".*\.self_attn\.o_proj\.weight$"),
        _p(_C, r".*\.self_attn\.[qkv]_proj\.weight$"),
        _p(_R, r".*\.block_sparse_moe\.experts\.\d+\.w2\.weight$"),
        _p(_C, r".*\.block_sparse_moe\.experts\.\d+\.w[13]\.weight$"),
        _p(_S, r".*\.block_sparse_moe\.gate\.weight$"),
    ),
    "deepseek_v2": (
        _p(_R, r".*\.self_attn\.o_proj\.weight$"),
        _p(_S, r".*\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$"),
        _p(_C, r".*\.self_attn\.(q_b_proj|kv_b_proj)\.weight$"),
        _p(_R, r".*\.mlp\.experts\.\d+\.down_proj\.weight$"),
        _p(_C, r".*\.mlp\.experts\.\d+\.(up|gate)_proj\.weight$"),
        _p(_S, r".*\.mlp\.gate\.weight$"),
        _p(_R, r".*\.mlp\.shared_experts\.down_proj\.weight$"),
        _p(_C, r".*\.mlp\.shared_experts\.(up|gate)_proj\.weight$"),
    ),
    "phi3": (
        _p(_R, r".*\.self_attn\.o_proj\.weight$"),
        _p(_C, r".*\.self_attn\.qkv_proj\.weight$", shape=(3, -1)),
        _p(_R, r".*\.mlp\.down_proj\.weight$"),
        _p(_C, r".*\.mlp\.gate_up_proj\.weight$", shape=(2, -1)),
    ),
}

# Hugging Face tp_plan styles -> (kind, gather_output, grad_allreduce); others make the plan unusable
_HF_STYLES = {
    "colwise": (_C, False, False),
    "colwise_rep": (_C, True, False),
    "colwise_gather_output": (_C, True, False),
    "rowwise": (_R, False, False),
    "embedding_rowwise": (_S, False, False),
    "replicated_with_grad_allreduce": (_S, False, True),
}

# The names of Hugging Face decoders' projections, for a model that brings no plan of its own
_ROW_NAMES = ("o_proj", "down_proj", "out_proj", "dense_4h_to_h", "fc2", "w2", "wo")
_COLUMN_NAMES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "gate_proj",
    "up_proj",
    "fc1",
    "dense_h_to_4h",
    "w1",
    "w3",
    "wi",
)
NAME_SPECS = (
    _p(_R, r".*\.(" + "|".join(_ROW_NAMES) + r")\.weight$"),
    _p(_C, r".*\.(" + "|".join(_COLUMN_NAMES) + r")\.weight$"),
)


def hf_plan(model: nn.Module) -> dict[str, str]:
    """The model's Hugging Face tensor-parallel plan: its config's base-model plan (prefixed with the base
    model's attribute name) and the model class's own (the LM head's)."""
    plan: dict[str, str] = {}
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    has_prefix = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
    for pattern, style in base.items():
        plan[f"{prefix}.{pattern}" if has_prefix else pattern] = style
    for source in (type(model).__dict__.get("_tp_plan"), model.__dict__.get("_tp_plan")):
        if isinstance(source, dict):
            plan.update(source)
    return plan


def specs_from_hf_plan(plan: dict[str, str]) -> tuple[Spec, ...]:
    """The plan as specs (``*`` stands for one layer index). A style ds does not know rejects the whole plan
    (as DeepSpeed does: applying the rest could split one half of a column/row pair)."""
    unknown = sorted({style for style in plan.values() if style.lower() not in _HF_STYLES})
    if unknown:
        raise ValueError(
            f"the model's Hugging Face tp_plan has partition styles AutoTP cannot apply: {unknown}; give "
            "tensor_parallel.partition_config.layer_specs for this model instead"
        )
    specs = []
    for pattern, style in plan.items():
        kind, gather, grad_allreduce = _HF_STYLES[style.lower()]
        regex = "^" + re.escape(pattern).replace(r"\*", r"[^.]+") + r"\.weight$"
        specs.append(Spec((regex,), kind, gather_output=gather, grad_allreduce=grad_allreduce))
    return tuple(specs)


def _from_config(section: Any) -> tuple[Spec, ...]:
    return tuple(
        Spec(
            tuple(s.patterns),
            s.partition_type,
            shape=tuple(tuple(d) if isinstance(d, list) else d for d in s.shape)
            if s.shape is not None
            else None,
            partition_dim=s.partition_dim,
            model_types=tuple(s.model_types) if s.model_types else None,
            gather_output=s.gather_output,
            grad_allreduce=s.grad_allreduce,
        )
        for s in section.layer_specs
    )


def resolve_specs(
    model: nn.Module, partition_config: Any, preset_model: str | None
) -> tuple[tuple[Spec, ...], str]:
    """``(specs, where they came from)`` for ``model``."""
    preset = PRESETS[preset_model] if preset_model else None
    if partition_config is not None:
        custom = _from_config(partition_config)
        if preset is not None and partition_config.use_default_specs:
            return custom + preset, f"partition_config then preset {preset_model!r}"
        return custom, "partition_config"
    if preset is not None:
        return preset, f"preset {preset_model!r}"
    plan = hf_plan(model)
    if plan:
        return specs_from_hf_plan(plan), "the model's Hugging Face tp_plan"
    return NAME_SPECS, "the projection names of Hugging Face decoders"


def find_spec(specs: tuple[Spec, ...], name: str, model_type: str | None) -> Spec | None:
    return next((s for s in specs if s.matches(name, model_type)), None)

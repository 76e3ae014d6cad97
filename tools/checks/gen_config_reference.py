"""Generate docs/reference/config.schema.json and docs/reference/config.md from the ds_config models.

    python tools/checks/gen_config_reference.py           # rewrite both files
    python tools/checks/gen_config_reference.py --check   # exit 1 if the committed files are stale

The field descriptions in packages/ds-config/src/ds_config/_models.py are the documentation; edit them
there and rerun this script.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from pathlib import Path

import annotated_types
import ds_config
from ds_config import _rules
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "docs" / "reference" / "config.schema.json"
MARKDOWN_PATH = ROOT / "docs" / "reference" / "config.md"

# (heading, JSON path, model), in the order a reader meets them in a config
SECTIONS: list[tuple[str, str, type[BaseModel]]] = [
    ("Top level", "", ds_config.DSConfig),
    ("optimizer", "optimizer", ds_config.OptimizerConfig),
    ("scheduler", "scheduler", ds_config.SchedulerConfig),
    ("fp16", "fp16", ds_config.FP16Config),
    ("bf16", "bf16", ds_config.BF16Config),
    ("amp", "amp", ds_config.AmpConfig),
    ("zero_optimization", "zero_optimization", ds_config.ZeroConfig),
    (
        "zero_optimization.offload_optimizer",
        "zero_optimization.offload_optimizer",
        ds_config.OffloadOptimizerConfig,
    ),
    (
        "zero_optimization.offload_param",
        "zero_optimization.offload_param",
        ds_config.OffloadParamConfig,
    ),
    ("zero_optimization.leaf_module", "zero_optimization.leaf_module", ds_config.LeafModuleConfig),
    ("activation_checkpointing", "activation_checkpointing", ds_config.ActivationCheckpointingConfig),
    ('sparse_attention, mode "dense"', "sparse_attention", ds_config.DenseSparseAttentionConfig),
    ('sparse_attention, mode "fixed" (default)', "sparse_attention", ds_config.FixedSparseAttentionConfig),
    ('sparse_attention, mode "variable"', "sparse_attention", ds_config.VariableSparseAttentionConfig),
    ('sparse_attention, mode "bigbird"', "sparse_attention", ds_config.BigBirdSparseAttentionConfig),
    (
        'sparse_attention, mode "bslongformer"',
        "sparse_attention",
        ds_config.BSLongformerSparseAttentionConfig,
    ),
    ("checkpoint", "checkpoint", ds_config.CheckpointConfig),
]

_BOUND_SYMBOLS = {
    annotated_types.Ge: (">=", "ge"),
    annotated_types.Gt: (">", "gt"),
    annotated_types.Le: ("<=", "le"),
    annotated_types.Lt: ("<", "lt"),
}


def render_type(annotation: object) -> str:
    """A short human-readable type: ``integer``, ``"Warn" | "Ignore"``, ``list[integer] | null``, ..."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return render_type(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(render_type(a) for a in args))  # dedupe, keep order
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is list:
        return f"list[{render_type(args[0])}]"
    if origin is dict:
        return "object"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    names = {int: "integer", float: "number", bool: "boolean", str: "string"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def render_bounds(field: object) -> str:
    parts = []
    for item in getattr(field, "metadata", []):
        for cls, (symbol, attr) in _BOUND_SYMBOLS.items():
            if isinstance(item, cls):
                parts.append(f"{symbol} {getattr(item, attr)}")
        if isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length} item(s)")
    return ", ".join(parts)


def render_default(field: object) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section defaults)"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_table(heading: str, path: str, model: type[BaseModel]) -> list[str]:
    summary = inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].replace("\n", " ")
    lines = [f"## {heading}", "", summary, ""]
    lines += ["| key | type | default | bounds | description |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = f"{path}.{name}" if path else name
        lines.append(
            f"| `{key}` | {_cell(render_type(field.annotation))} | {_cell(render_default(field))} | "
            f"{_cell(render_bounds(field))} | {_cell(field.description or '')} |"
        )
    return [*lines, ""]


def markdown() -> str:
    lines = [
        "# DeepSpeed config reference (ds)",
        "",
        "Generated by `tools/checks/gen_config_reference.py` from the `ds_config` models; do not edit by hand.",
        "The JSON Schema is in [config.schema.json](config.schema.json).",
        "",
        "Load a config with `ds_config.load_config(source, world_size=N)`. Unknown keys are errors (with a",
        'did-you-mean) unless `strict=False`; `"auto"` values must be resolved with `auto_values`; a JSON `null`',
        "behaves as an absent key. Every problem is reported at once in one `ConfigError`.",
        "",
    ]
    for heading, path, model in SECTIONS:
        lines += section_table(heading, path, model)
    lines += [
        "## Keys with no effect in ds",
        "",
        "Every other key is read by the package it configures (its `CONFIG_FIELDS`; "
        "`tools/checks/check_config_consumers.py`",
        "checks that each key has a consumer or a row here). These keys load, and setting one to a value other",
        "than its default warns once (`ConfigWarning`) with the reason:",
        "",
        "| key | why it has no effect |",
        "|---|---|",
        *[f"| `{path}` | {_cell(reason)} |" for path, reason in ds_config.NO_EFFECT.items()],
        "",
        "## Names",
        "",
        "Optimizers: "
        + ", ".join(ds_config.NATIVE_OPTIMIZERS.values())
        + " (case-insensitive), or a torch.optim "
        "class spelled exactly: " + ", ".join(_rules.TORCH_OPTIMIZERS) + ".",
        "",
        "Schedulers: "
        + ", ".join(ds_config.NATIVE_SCHEDULERS)
        + ", or a torch.optim.lr_scheduler class: "
        + ", ".join(_rules.TORCH_LR_SCHEDULERS)
        + ".",
        "",
        "## Cross-key rules",
        "",
        "Checked by `load_config` after the types and bounds; each names the keys involved. Sparse-attention",
        "keys that belong to another mode are ignored when they hold that mode's default and rejected otherwise",
        "(the message names the modes that use the key).",
        "",
    ]
    for rule in _rules.RULES:
        lines.append(f"- `{rule.__name__}`: {(rule.__doc__ or '').strip()}")
    return "\n".join(lines) + "\n"


def schema() -> str:
    return json.dumps(ds_config.DSConfig.model_json_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed files are stale")
    args = parser.parse_args(argv)
    outputs = {SCHEMA_PATH: schema(), MARKDOWN_PATH: markdown()}
    if args.check:
        stale = [p for p, text in outputs.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
        if stale:
            names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
            print(
                f"stale: {names}; run `python tools/checks/gen_config_reference.py` and commit the result",
                file=sys.stderr,
            )
            return 1
        print("docs/reference is up to date")
        return 0
    for path, text in outputs.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ds does with each config key of DeepSpeed 0.19.8 (used by ``check_deepspeed_surface.py``).

The keys are the surface record's ``config_keys`` (``tools/fixtures/record_deepspeed_config_keys.py``, run
with the real DeepSpeed: every key its ``DeepSpeedConfig`` reads and every field and alias of its config
models). Each is exactly one of:

- **effect**: ds's ``DSConfig`` has the key (or the alias), read by the packages named (their
  ``CONFIG_FIELDS``), or a section ds has;
- **no effect**: ds accepts it and acts on nothing, for the reason in ``ds_config.NO_EFFECT`` (a key of a
  feature ds lacks is accepted only at its default or disabled value, and refuses anything else naming it);
- **refused**: ds's loader refuses the key with the reason in ``ds_config.DEEPSPEED_REFUSED`` (the message
  the user sees names it).

A key that is none of them fails the check: give it its effect in ds_config or a refusal with the reason.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "packages/deepspeed/tests/fixtures/deepspeed_0.19.8_surface.json"


@dataclass
class KeyStatus:
    key: str
    status: str  # "effect" | "no effect" | "refused" | "missing"
    detail: str


def _consumers() -> dict[str, list[str]]:
    spec = importlib.util.spec_from_file_location(
        "check_config_consumers", ROOT / "tools/checks/check_config_consumers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.declarations(ROOT)


def _ds_path(parts: list[str]) -> tuple[str, Any, str] | None:
    """``(ds path, field annotation or section model, rest)`` for DeepSpeed's key ``parts`` in ds's DSConfig:
    the path ds knows it by (aliases resolved), what ds holds there, and the part of the key below a field
    that takes a free-form dict (``optimizer.params.lr``). None where ds has no such key."""
    import ds_config
    from ds_config._fields import section_models

    model: Any = ds_config.DSConfig
    done: list[str] = []
    for i, part in enumerate(parts):
        aliases = getattr(model, "KEY_ALIASES", {})
        part = aliases.get(part, part)
        fields = model.model_fields
        name = next((n for n, f in fields.items() if part in (n, f.alias)), None)
        if name is None:
            if model.model_config.get("extra") == "allow":  # sub-keys passed over while disabled
                return ".".join(done), model, ".".join(parts[i:])
            return None
        done.append(name)
        sections = section_models(fields[name].annotation)
        if not sections:
            return ".".join(done), fields[name].annotation, ".".join(parts[i + 1 :])
        if i + 1 < len(parts):
            # sparse_attention's modes: the first model that has the next key
            nxt = parts[i + 1]
            model = next(
                (m for m in sections if nxt in m.model_fields or nxt in getattr(m, "KEY_ALIASES", {})),
                sections[0],
            )
    return ".".join(done), model, ""


def refusal(key: str) -> str | None:
    import ds_config

    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        reason = ds_config.DEEPSPEED_REFUSED.get(".".join(parts[:i]))
        if reason is not None:
            return reason
    return None


def classify(record: dict[str, Any] | None = None) -> list[KeyStatus]:
    import ds_config

    record = record or json.loads(RECORD.read_text())
    keys = record["config_keys"]["keys"]
    consumers = _consumers()
    out = []
    for key, entry in keys.items():
        found = _ds_path(key.split("."))
        alias = entry.get("alias_of")
        note = f" (DeepSpeed's alias of `{alias}`)" if alias else ""
        if found is None:
            reason = refusal(key)
            out.append(
                KeyStatus(key, "refused" if reason else "missing", (reason or "no ds key, no refusal") + note)
            )
            continue
        path, held, rest = found
        shown = f"`{path}`" + (f" (`{rest}` inside it)" if rest else "") if path != key else ""
        if path in ds_config.NO_EFFECT:
            out.append(
                KeyStatus(key, "no effect", " ".join(filter(None, [shown, ds_config.NO_EFFECT[path]])) + note)
            )
        elif path in consumers:
            text = f"read by {', '.join(consumers[path])}"
            out.append(KeyStatus(key, "effect", " ".join(filter(None, [shown, text])) + note))
        elif isinstance(held, type) and hasattr(held, "model_fields") and not rest:
            out.append(
                KeyStatus(key, "effect", " ".join(filter(None, [shown, "a section of ds's config"])) + note)
            )
        elif isinstance(held, type) and hasattr(held, "model_fields"):
            out.append(
                KeyStatus(
                    key, "no effect", f"{shown} accepted unchecked while the section is disabled" + note
                )
            )
        else:
            out.append(KeyStatus(key, "missing", f"{shown} has neither a consumer nor a NO_EFFECT reason"))
    return out


def render(rows: list[KeyStatus]) -> list[str]:
    lines = [
        "",
        "## Config keys of DeepSpeed 0.19.8",
        "",
        "Every key DeepSpeed 0.19.8 accepts (its `DeepSpeedConfig`'s reads and its config models' fields and "
        "aliases, recorded by `tools/fixtures/record_deepspeed_config_keys.py`) and what ds does with it: "
        "**effect** (read by the ds packages named), **no effect** (accepted; the reason; a feature ds lacks "
        "is accepted only at its default or disabled value), **refused** (loading fails, the message gives "
        "the reason).",
        "",
        "| key | in ds | what ds does |",
        "|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| `{row.key}` | {row.status} | {row.detail.replace('|', '/')} |")
    return lines

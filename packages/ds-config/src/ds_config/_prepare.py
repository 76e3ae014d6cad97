"""Work on the raw dict before pydantic sees it: "auto" placeholders, nulls, and unknown keys."""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from functools import cache
from typing import Any, get_args

from pydantic import BaseModel

from ._deepspeed_keys import DEEPSPEED_DEFAULTS, deepspeed_refusal
from ._errors import ConfigProblem, ConfigWarning
from ._models import SPARSE_ATTENTION_MODELS, DSConfig

__all__ = ["Preparation", "prepare"]

AUTO = "auto"

# Keys DeepSpeed knows that ds deliberately does not implement, with what to do instead.


@dataclass
class Preparation:
    """What ``prepare`` found: problems to report and warnings already issued."""

    problems: list[ConfigProblem] = field(default_factory=list)
    auto_paths: list[str] = field(default_factory=list)


def prepare(data: dict[str, Any], *, strict: bool, auto_values: dict[str, Any] | None) -> Preparation:
    """Resolve "auto" values, drop nulls, and strip unknown keys from ``data`` (in place)."""
    prep = Preparation()
    _resolve_auto(data, "", auto_values or {}, prep)
    _walk(DSConfig, data, "", strict, prep)
    return prep


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# sections whose values are DeepSpeed's own, passed through as written ("stages": "auto" is a real value)
_VERBATIM = frozenset({"pipeline"})


def _resolve_auto(node: Any, path: str, auto_values: dict[str, Any], prep: Preparation) -> None:
    if not isinstance(node, dict) or path in _VERBATIM:
        return
    for key in list(node):
        sub = _join(path, key)
        value = node[key]
        if isinstance(value, str) and value == AUTO:
            if sub in auto_values:
                node[key] = auto_values[sub]
            else:
                prep.auto_paths.append(sub)
                del node[key]  # reported once, as an unresolved "auto", not again as a type error
        else:
            _resolve_auto(value, sub, auto_values, prep)


@cache
def _nested_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    """The section model a dict under ``model.key`` is validated against, if any."""
    stack = [model.model_fields[key].annotation]
    while stack:
        annotation = stack.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        stack.extend(get_args(annotation))
    return None


@cache
def _leaf_index() -> dict[str, list[str]]:
    """Every key name -> the dotted paths where it is valid, for "did you mean section.key" hints."""
    index: dict[str, list[str]] = {}

    def visit(model: type[BaseModel], path: str) -> None:
        for name in model.model_fields:
            index.setdefault(name, []).append(_join(path, name))
            nested = _nested_model(model, name)
            if nested is not None and name != "sparse_attention":
                visit(nested, _join(path, name))

    visit(DSConfig, "")
    for mode_model in SPARSE_ATTENTION_MODELS.values():
        for name in mode_model.model_fields:
            paths = index.setdefault(name, [])
            if f"sparse_attention.{name}" not in paths:
                paths.append(f"sparse_attention.{name}")
    return index


def _suggestion(key: str, path: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{_join(path, close[0])}'?"
    elsewhere = [p for p in _leaf_index().get(key, []) if p != _join(path, key)]
    if elsewhere:
        return f"; did you mean '{elsewhere[0]}'?"
    return ""


def _unknown(path: str, key: str, value: Any, candidates: list[str], strict: bool, prep: Preparation) -> None:
    sub = _join(path, key)
    if sub in DEEPSPEED_DEFAULTS and deepspeed_refusal(sub, value) is None:
        return  # DeepSpeed's default value of a key ds has no use for: accepted, no effect
    reason = deepspeed_refusal(sub, value)
    if reason is not None:
        message = f"not supported by ds: {reason}"
    else:
        message = f"unknown key{_suggestion(key, path, candidates)}"
    _report(ConfigProblem(sub, message, value, strict_only=True), strict, prep)


def _report(problem: ConfigProblem, strict: bool, prep: Preparation) -> None:
    if strict:
        prep.problems.append(problem)
    else:
        warnings.warn(f"{problem} (ignored: strict=False)", ConfigWarning, stacklevel=4)


def _walk(model: type[BaseModel], data: dict[str, Any], path: str, strict: bool, prep: Preparation) -> None:
    fields = model.model_fields
    allows_extra = model.model_config.get("extra") == "allow"
    aliases: dict[str, str] = getattr(model, "KEY_ALIASES", {})
    for key in list(data):
        if key in aliases:  # DeepSpeed's other spelling of a key: read as that key
            if aliases[key] in data:
                message = f"is another name for '{_join(path, aliases[key])}'; give only one of them"
                prep.problems.append(ConfigProblem(_join(path, key), message, data[key]))
                del data[key]
                continue
            data[aliases[key]] = data.pop(key)
            key = aliases[key]
        value = data[key]
        if not isinstance(key, str) or key not in fields:
            if allows_extra:
                continue  # amp: extra keys are passed through to apex.amp.initialize
            _unknown(path, str(key), value, list(fields), strict, prep)
            del data[key]
            continue
        if value is None and key not in getattr(model, "NULL_REFUSED", ()):
            del data[key]  # an explicit JSON null behaves like an absent key, as in DeepSpeed's dict.get
            continue
        sub = _join(path, key)
        if model is DSConfig and key == "sparse_attention" and isinstance(value, dict):
            _walk_sparse_attention(value, sub, strict, prep)
            continue
        nested = _nested_model(model, key)
        if nested is not None and isinstance(value, dict) and key not in ("params",):
            _walk(nested, value, sub, strict, prep)


def _walk_sparse_attention(data: dict[str, Any], path: str, strict: bool, prep: Preparation) -> None:
    for key in [k for k, v in data.items() if v is None]:
        del data[key]  # null behaves as absent, before the mode is looked up
    mode = data.get("mode", "fixed")
    if not isinstance(mode, str) or mode not in SPARSE_ATTENTION_MODELS:
        return  # pydantic reports the bad mode with the list of modes
    model = SPARSE_ATTENTION_MODELS[mode]
    for key in list(data):
        if key in model.model_fields:
            continue
        users = [m for m, other in SPARSE_ATTENTION_MODELS.items() if key in other.model_fields]
        if not users:
            continue  # truly unknown: _walk reports it with a did-you-mean below
        value = data.pop(key)
        default = SPARSE_ATTENTION_MODELS[users[0]].model_fields[key].get_default(call_default_factory=True)
        if value is None or value == default:
            continue  # a default-valued key of another mode (as in the reference's example) is harmless
        message = (
            f"is not used in mode '{mode}' (it is used by mode{'s' if len(users) > 1 else ''} "
            f"{', '.join(repr(u) for u in users)}); remove it or change mode"
        )
        _report(ConfigProblem(_join(path, key), message, value, strict_only=True), strict, prep)
    _walk(model, data, path, strict, prep)

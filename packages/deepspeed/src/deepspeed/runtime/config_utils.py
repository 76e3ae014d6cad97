"""DeepSpeed's ``deepspeed.runtime.config_utils``: the helpers code built on DeepSpeed's config reuses.

``DeepSpeedConfigModel`` is the pydantic base DeepSpeed's own section models (and some libraries' config
models) derive from: unknown keys are refused, fields are filled by name or alias, ``"auto"`` values are
dropped (so Hugging Face configs load), and a field declared ``Field(..., json_schema_extra={"deprecated":
True, "new_param": "other"})`` is accepted with a warning and moved onto its replacement. The ``get_*``
helpers read one key of a raw config dict with a default. ds's own config sections are ds_config's models;
nothing here parses a DeepSpeed config a second time.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

from deepspeed.utils.logging import logger

__all__ = [
    "DeepSpeedConfigModel",
    "DeepSpeedConfigObject",
    "ScientificNotationEncoder",
    "dict_raise_error_on_duplicate_keys",
    "get_config_default",
    "get_dict_param",
    "get_list_param",
    "get_scalar_param",
    "pp_int",
]


class DeprecatedFieldConflict(AssertionError, ValueError):
    """A deprecated field and the field replacing it, both given: DeepSpeed's ``AssertionError`` (also a
    ``ValueError``, which is what pydantic's callers catch)."""


class DeepSpeedConfigModel(BaseModel):
    """Base for DeepSpeed-style config models (see the module docstring for what it adds to pydantic)."""

    model_config = ConfigDict(
        validate_default=True,
        validate_assignment=True,
        use_enum_values=True,
        populate_by_name=True,
        extra="forbid",
        arbitrary_types_allowed=True,
        protected_namespaces=(),
    )

    def __init__(self, strict: bool = False, **data: Any) -> None:
        if not strict:  # Hugging Face's "auto" placeholders are left to the defaults
            data = {k: v for k, v in data.items() if v != "auto" or k == "replace_method"}
        super().__init__(**data)
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra
            if isinstance(extra, dict) and extra.get("deprecated"):
                self._move_deprecated(name, extra)

    def _move_deprecated(self, name: str, extra: dict[str, Any]) -> None:
        """A deprecated field that was set: warn, and set its replacement (unless that was set too)."""
        if name not in self.model_fields_set:
            return
        new = extra.get("new_param", "")
        message = extra.get("deprecated_msg", "")
        logger.warning(
            f"Config parameter {name} is deprecated"
            + (f" use {new} instead" if new else "")
            + (f". {message}" if message else "")
        )
        if not new or not extra.get("set_new_param", True):
            return
        target, *rest = new.split(".")
        owner = self
        for part in new.split(".")[:-1]:  # a nested field: the sub-model whose fields were set
            owner = getattr(owner, part)
        if new.split(".")[-1] in owner.model_fields_set:
            raise DeprecatedFieldConflict(
                f"Cannot provide deprecated parameter '{name}' and replacing parameter '{new}' together"
            )
        convert: Callable[[Any], Any] = extra.get("new_param_fn", lambda value: value)
        value = convert(getattr(self, name))
        if rest:  # a nested field: "section.field"
            setattr(getattr(self, target), rest[0], value)
        else:
            setattr(self, target, value)


def get_config_default(config: type[BaseModel], field_name: str) -> Any:
    """The default of ``field_name`` on the model class ``config`` (it must have one)."""
    assert field_name in config.model_fields, f"'{field_name}' is not a field in {config}"
    field = config.model_fields[field_name]
    assert not field.is_required(), f"'{field_name}' is a required field and does not have a default value"
    return field.get_default(call_default_factory=True)


class pp_int(int):  # noqa: N801 - DeepSpeed's name
    """An int that prints readably (``5e8`` as ``500,000,000``); ``custom_print_str`` overrides the text."""

    def __new__(cls, val: int, custom_print_str: str | None = None) -> pp_int:
        inst = super().__new__(cls, val)
        inst.custom_print_str = custom_print_str
        return inst

    def __repr__(self) -> str:
        return self.custom_print_str if self.custom_print_str else f"{self.real:,}"


class ScientificNotationEncoder(json.JSONEncoder):
    """JSON with large numbers (>= 1e3) written in scientific notation, nested dicts indented."""

    def iterencode(self, o: Any, _one_shot: bool = False, level: int = 0) -> Any:
        indent = self.indent if self.indent is not None else 4
        prefix_close = " " * level * indent
        level += 1
        prefix = " " * level * indent
        if isinstance(o, bool):
            return "true" if o else "false"
        if isinstance(o, (float, int)):
            return f"{o:e}" if o > 1e3 else str(o)
        if isinstance(o, collections.abc.Mapping):
            body = [f'\n{prefix}"{k}": {self.iterencode(v, level=level)}' for k, v in o.items()]
            return "{" + ", ".join(body) + f"\n{prefix_close}}}"
        if isinstance(o, collections.abc.Sequence) and not isinstance(o, str):
            return f"[{', '.join(map(self.iterencode, o))}]"
        return "\n, ".join(super().iterencode(o, _one_shot))


class DeepSpeedConfigObject:
    """A plain config holder whose ``repr`` is its attributes as JSON."""

    def repr(self) -> dict[str, Any]:
        return self.__dict__

    def __repr__(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True, indent=4, cls=ScientificNotationEncoder)


def get_scalar_param(param_dict: dict[str, Any], param_name: str, param_default_value: Any) -> Any:
    """``param_dict[param_name]``, or the default when absent."""
    return param_dict.get(param_name, param_default_value)


def get_list_param(param_dict: dict[str, Any], param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def get_dict_param(param_dict: dict[str, Any], param_name: str, param_default_value: Any) -> Any:
    return param_dict.get(param_name, param_default_value)


def dict_raise_error_on_duplicate_keys(ordered_pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for json/hjson: a key given twice is an error naming the keys."""
    d = dict(ordered_pairs)
    if len(d) != len(ordered_pairs):
        counter = collections.Counter(k for k, _ in ordered_pairs)
        keys = [k for k, n in counter.items() if n > 1]
        raise ValueError(f"Duplicate keys in DeepSpeed config: {keys}")
    return d

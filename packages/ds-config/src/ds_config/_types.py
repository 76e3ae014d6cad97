"""JSON-faithful scalar types: no silent string/bool/float-to-int coercion."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, StrictBool

__all__ = ["JsonBool", "JsonFloat", "JsonInt"]


def _json_int(value: Any) -> Any:
    # JSON has no int/float distinction (users write 5e8 for bucket sizes), but "32" or true is a mistake.
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError("expected an integer, got a number with a fractional part")
    if isinstance(value, str):
        raise ValueError("expected an integer, got a string")
    return value


def _json_float(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, str):
        raise ValueError("expected a number, got a string")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_int)]
JsonFloat = Annotated[float, BeforeValidator(_json_float)]
JsonBool = StrictBool

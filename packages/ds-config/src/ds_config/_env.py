"""The one way ds reads its ``DS_*`` environment variables (every one is listed in docs/environment.md).

A flag is on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/``no``/``off`` (any case, spaces
around ignored); a choice is one of its listed words; a number is a decimal. Unset or empty gives the
default. Anything else is an :class:`EnvironmentVariableError` naming the variable, its value and what it
accepts, never a silent default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["EnvironmentVariableError", "env_choice", "env_flag", "env_number"]

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


class EnvironmentVariableError(ValueError):
    """A ``DS_*`` variable holds a value it does not accept; the message names both and what it accepts."""


def _raw(name: str, environ: Mapping[str, str] | None) -> str:
    return (os.environ if environ is None else environ).get(name, "").strip()


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """``name`` read as on/off (``1 true yes on`` / ``0 false no off``); ``default`` when unset or empty."""
    value = _raw(name, environ).lower()
    if not value:
        return default
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise EnvironmentVariableError(
        f"{name}={value!r} is neither on ({', '.join(_ON)}) nor off ({', '.join(_OFF)}); set one or unset it"
    )


def env_choice(name: str, choices: Sequence[str], default: str, environ: Mapping[str, str] | None = None) -> str:
    """``name`` read as one of ``choices`` (case-sensitive); ``default`` when unset or empty."""
    value = _raw(name, environ)
    if not value:
        return default
    if value not in choices:
        raise EnvironmentVariableError(
            f"{name}={value!r} is not one of {', '.join(choices)}; set one or unset it (default {default!r})"
        )
    return value


def env_number(name: str, default: float, environ: Mapping[str, str] | None = None) -> float:
    """``name`` read as a decimal number; ``default`` when unset or empty."""
    value = _raw(name, environ)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise EnvironmentVariableError(f"{name}={value!r} is not a number; set one or unset it") from None

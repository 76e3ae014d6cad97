"""Names of DeepSpeed features that ds does not have: importable, failing at use with the feature named.

A script that merely imports ``deepspeed.pipe`` or ``deepspeed.moe`` (many do, unconditionally) keeps
working; the first call to one of these names raises :class:`FeatureNotAvailableError`. Each such name
carries ``__ds_missing__`` (the feature), which ``tools/checks/check_deepspeed_surface.py`` reads and then checks
by calling the name.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["FeatureNotAvailableError", "missing_class", "missing_function"]


class FeatureNotAvailableError(NotImplementedError):
    """The script uses a DeepSpeed feature that ds does not implement; the message names it."""


def _fail(qualname: str, feature: str, instead: str) -> NoReturn:
    raise FeatureNotAvailableError(
        f"{qualname}: {feature} is not available in ds (DeepSpeed has it, ds does not). {instead}"
    )


def missing_class(module: str, name: str, feature: str, instead: str) -> type:
    """A class named ``name`` whose construction raises, naming ``feature`` and what to do instead."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        _fail(f"{module}.{name}", feature, instead)

    namespace = {
        "__init__": __init__,
        "__module__": module,
        "__doc__": f"Not in ds: {feature}.",
        "__ds_missing__": feature,
    }
    return type(name, (), namespace)


def missing_function(module: str, name: str, feature: str, instead: str) -> Any:
    """A function named ``name`` that raises, naming ``feature`` and what to do instead."""

    def missing(*args: Any, **kwargs: Any) -> NoReturn:
        _fail(f"{module}.{name}", feature, instead)

    missing.__name__ = missing.__qualname__ = name
    missing.__module__ = module
    missing.__doc__ = f"Not in ds: {feature}."
    missing.__ds_missing__ = feature  # type: ignore[attr-defined]
    return missing

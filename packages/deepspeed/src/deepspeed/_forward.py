"""One way to map a DeepSpeed module path onto the ds module that implements it.

A module file under ``deepspeed/`` that is a pure alias calls :func:`forward` with its ds implementation:
every attribute it does not define itself is looked up there (PEP 562 ``__getattr__``), so
``from deepspeed.comm import all_reduce`` and ``deepspeed.comm.get_rank()`` reach the one
implementation, and ``from deepspeed.comm import *`` gets the implementation's ``__all__``. A package
alias also finds its own submodule files (``deepspeed.utils.groups`` without importing it first).
A name neither has is an ``AttributeError`` that says which ds module was searched.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["forward", "submodules"]


def forward(
    alias: str, *impls: ModuleType, extra: list[str] | None = None
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for the module ``alias`` forwarding to ``impls`` (first hit wins).

    ``extra`` lists names the alias module defines itself (they join ``__all__``).
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            for impl in impls:
                if hasattr(impl, name):
                    return getattr(impl, name)
            if _is_package(alias) and importlib.util.find_spec(f"{alias}.{name}") is not None:
                return importlib.import_module(f"{alias}.{name}")  # a submodule file under the alias
        searched = ", ".join(impl.__name__ for impl in impls)
        raise AttributeError(
            f"module {alias!r} has no attribute {name!r} (ds maps {alias} onto {searched}, "
            f"which do not have it either)"
        )

    def __dir__() -> list[str]:
        return sorted(set().union(*(dir(impl) for impl in impls)) | set(extra or []))

    names = set(extra or [])
    for impl in impls:
        names |= set(getattr(impl, "__all__", [n for n in dir(impl) if not n.startswith("_")]))
    return sorted(names), __getattr__, __dir__


def submodules(alias: str) -> Callable[[str], Any]:
    """``__getattr__`` for a package alias that only holds submodules: ``deepspeed.runtime.lr_schedules``
    works as an attribute without importing it first, as it does under DeepSpeed (whose ``__init__``
    imports its submodules eagerly)."""

    def __getattr__(name: str) -> Any:
        if not name.startswith("__") and importlib.util.find_spec(f"{alias}.{name}") is not None:
            return importlib.import_module(f"{alias}.{name}")
        raise AttributeError(f"module {alias!r} has no attribute {name!r}")

    return __getattr__


def _is_package(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None

"""Test helper: record which config keys a package's code reads, to check its ``CONFIG_FIELDS``.

    reads = ConfigReads()
    cfg = reads.wrap(load_config({...}))
    loss_scaler_from_config(cfg.fp16)
    reads.check("ds_precision", ds_precision.CONFIG_FIELDS)

``wrap`` returns a copy of the model (and of every section inside it) whose class is a subclass of the
original, so ``isinstance(cfg.fp16, FP16Config)`` still holds; reading a leaf field records its dotted
path under the top-level package of the code that read it (reads inside ds_config itself, e.g. a
property such as ``ZeroConfig.offload_device``, count for the caller). Run the code under test over
enough configs to reach every branch that reads a key, then ``check``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypeVar

from pydantic import BaseModel

from ._fields import leaf_paths, section_models

__all__ = ["ConfigReads"]

M = TypeVar("M", bound=BaseModel)

# id(recording instance) -> (its dotted prefix, the recorder); entries live as long as the recorder.
_TRACKED: dict[int, tuple[str, ConfigReads]] = {}
_CLASSES: dict[type[BaseModel], type[BaseModel]] = {}
# frames in these modules are not "the reader": they are the model or its validation machinery
_SKIPPED_PACKAGES = ("ds_config", "pydantic", "pydantic_core", "typing", "functools")


def _reader_package() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        package = frame.f_globals.get("__name__", "?").split(".")[0]
        if package not in _SKIPPED_PACKAGES:
            return package
        frame = frame.f_back
    return "?"


def _recording_class(cls: type[M]) -> type[M]:
    """A subclass of ``cls`` that reports every read of one of its leaf fields."""
    if cls in _CLASSES:
        return _CLASSES[cls]  # type: ignore[return-value]
    leaves = frozenset(n for n, f in cls.model_fields.items() if not section_models(f.annotation))

    def __getattribute__(self: Any, name: str) -> Any:  # noqa: N807
        value = cls.__getattribute__(self, name)
        if name in leaves:
            tracked = _TRACKED.get(id(self))
            if tracked is not None:
                prefix, recorder = tracked
                recorder.paths[_reader_package()].add(prefix + name)
        return value

    recording = type(cls)(f"Recording{cls.__name__}", (cls,), {"__getattribute__": __getattribute__})
    _CLASSES[cls] = recording
    return recording  # type: ignore[return-value]


class ConfigReads:
    """Records, per reading package, the dotted config paths read from models made by :meth:`wrap`."""

    def __init__(self) -> None:
        self.paths: dict[str, set[str]] = defaultdict(set)
        self._alive: list[BaseModel] = []  # keeps ids in _TRACKED from being reused

    def wrap(self, model: M, prefix: str = "") -> M:
        """A recording copy of ``model`` (a ``DSConfig`` or one section; give a section its prefix, e.g.
        ``"fp16."``). The original is not changed."""
        copy = model.model_copy()
        for name, field in type(model).model_fields.items():
            child = copy.__dict__.get(name)
            if section_models(field.annotation) and isinstance(child, BaseModel):
                copy.__dict__[name] = self.wrap(child, f"{prefix}{name}.")
        object.__setattr__(copy, "__class__", _recording_class(type(model)))
        _TRACKED[id(copy)] = (prefix, self)
        self._alive.append(copy)
        return copy

    def read_by(self, package: str) -> set[str]:
        """The paths code in ``package`` (top-level import name, e.g. ``"ds_precision"``) has read."""
        return set(self.paths.get(package, set()))

    def check(self, package: str, declared: Iterable[str]) -> None:
        """Fail unless ``package`` read exactly the ``declared`` paths, and each is a real config leaf."""
        declared = set(declared)
        read = self.read_by(package)
        unknown = sorted(declared - set(leaf_paths()))
        undeclared = sorted(read - declared)
        unread = sorted(declared - read)
        problems = []
        if unknown:
            problems.append(f"declared paths that are not DSConfig leaves: {unknown}")
        if undeclared:
            problems.append(f"read but missing from {package}.CONFIG_FIELDS: {undeclared}")
        if unread:
            problems.append(f"in {package}.CONFIG_FIELDS but never read by the code exercised: {unread}")
        if problems:
            raise AssertionError("; ".join(problems))

    def __del__(self, _tracked: dict = _TRACKED) -> None:
        # bound at definition: at interpreter exit the module global may already be None
        for obj in self._alive:
            _tracked.pop(id(obj), None)

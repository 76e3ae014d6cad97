"""Reading a config source: a dict, a JSON file path, or a (urlsafe) base64 JSON string."""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError, ConfigProblem

__all__ = ["ConfigSource", "read_source"]

ConfigSource = Mapping[str, Any] | str | os.PathLike[str]

ROOT = "<root>"


class _DuplicateKeys(Exception):
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    duplicates = []
    for key, value in pairs:
        if key in seen:
            duplicates.append(key)
        seen[key] = value
    if duplicates:
        raise _DuplicateKeys(duplicates)
    return seen


def _parse_json(text: str, origin: str) -> dict[str, Any]:
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKeys as dup:
        raise ConfigError(
            [ConfigProblem(ROOT, f"duplicate keys in DeepSpeed config: {dup.keys}; keep one of each")], origin
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError([ConfigProblem(ROOT, f"not valid JSON: {exc}")], origin) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem(ROOT, "expected a JSON object at the top level", data)], origin)
    return data


def _decode_base64(text: str) -> str | None:
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    for decode in (base64.urlsafe_b64decode, base64.b64decode):
        try:
            return decode(padded.encode("ascii")).decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            continue
    return None


def _looks_like_path(source: str | os.PathLike[str]) -> bool:
    """A PathLike, or a string no base64 JSON could be: it has a dot or a path separator."""
    return not isinstance(source, str) or any(c in source for c in "./\\") or os.path.exists(source)


def _not_a_file(path: Path) -> str:
    if path.is_dir():
        return "is a directory, not a JSON config file"
    return f"no such file (the working directory is {os.getcwd()})"


def _read_file(path: Path) -> str:
    """The file's text; a file that cannot be read is a one-line ConfigError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [ConfigProblem(ROOT, f"not UTF-8 text ({exc.reason} at byte {exc.start})")], str(path)
        ) from None
    except OSError as exc:
        raise ConfigError(
            [ConfigProblem(ROOT, f"cannot be read: {exc.strerror or exc}")], str(path)
        ) from None


def read_source(source: Any) -> tuple[dict[str, Any], str]:
    """Return ``(raw dict, description of where it came from)``; the caller's dict is never modified."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source)), "dict"
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            is_file = path.is_file()
        except (OSError, ValueError):  # a long base64 string is not a valid path on some systems
            is_file = False
        if is_file:
            return _parse_json(_read_file(path), str(path)), str(path)
        if isinstance(source, str):
            decoded = _decode_base64(source)
            if decoded is not None and decoded.lstrip().startswith("{"):
                return _parse_json(decoded, "base64 string"), "base64 string"
        if _looks_like_path(source):
            raise ConfigError([ConfigProblem(ROOT, _not_a_file(path))], str(path))
    shown = repr(source)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ConfigError(
        [
            ConfigProblem(
                ROOT,
                "expected a dict, a path to an existing JSON config file, or a urlsafe-base64-encoded JSON "
                f"string; received {shown}",
            )
        ]
    )

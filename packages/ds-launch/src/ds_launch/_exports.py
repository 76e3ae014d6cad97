"""The environment that must travel with ranks started on other hosts (DeepSpeed's rules)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["EXPORT_PREFIXES", "EnvFileError", "exported_environment", "read_env_file", "env_file_paths"]

# DeepSpeed V14 exports these families: NCCL/UCX tune the transports, PYTHON* find the code,
# MV2 configures MVAPICH, MLFLOW carries experiment tracking.
EXPORT_PREFIXES = ("NCCL", "PYTHON", "MV2", "UCX", "MLFLOW")
DEFAULT_ENV_FILE = ".deepspeed_env"


class EnvFileError(ValueError):
    """A malformed line in a ``.deepspeed_env``-style file."""


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines; blank lines and ``#`` comments are skipped, anything else is an error."""
    values: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or any(c.isspace() for c in key.strip()):
            raise EnvFileError(f"{path} line {number}: expected KEY=VALUE, got {line!r}")
        values[key.strip()] = value
    return values


def env_file_paths(env: Mapping[str, str], cwd: Path) -> list[Path]:
    """The env files to read, home first so that the working directory's file wins."""
    name = env.get("DS_ENV_FILE", DEFAULT_ENV_FILE)
    return [Path(os.path.expanduser("~")) / name, cwd / name]


def exported_environment(
    env: Mapping[str, str], cwd: Path, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Variables to pass to remote ranks: the prefixed families, env files, ``extra``; PYTHONPATH gets cwd."""
    exports = {k: v for k, v in env.items() if k.startswith(EXPORT_PREFIXES)}
    for path in env_file_paths(env, cwd):
        if path.is_file():
            exports.update(read_env_file(path))
    exports.update(extra or {})
    # The script is usually imported relative to where the user launched it, on every host.
    old = exports.get("PYTHONPATH", "")
    exports["PYTHONPATH"] = f"{cwd}{os.pathsep}{old}" if old else str(cwd)
    return exports

"""The envelope every benchmark record carries: the command, the commit, the versions, the machine's load.

A benchmark writes ``{**provenance(), ...its figures...}`` as its ``--json`` record, so that each figure in
docs/benchmarks.md can be traced to the code and machine that produced it and rerun with the same command.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_PACKAGES = ("torch", "deepspeed", "transformers", "accelerate", "lightning")


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (empty where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    """``command``, ``commit``, ``versions``, ``machine``, ``date`` and ``load_average_start`` of this run."""
    return {
        "command": shlex.join([Path(sys.executable).name, *(sys.argv if argv is None else argv)]),
        "commit": _commit(),
        "versions": _versions(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.machine()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": load_average(),
    }


def write(path: str | os.PathLike | None, figures: dict[str, Any], argv: list[str] | None = None) -> None:
    """Write ``figures`` inside the envelope to ``path`` (nothing when ``path`` is None), with the load at
    the end of the run beside the load at its start. ``provenance`` is taken now: call it at the end."""
    if path is None:
        return
    import json

    record = {**provenance(argv), **figures, "load_average_end": load_average()}
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"record written: {path}")

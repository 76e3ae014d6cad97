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


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()


def _commit() -> str | None:
    """HEAD, with ``-dirty`` where tracked files other than the kept records and their page
    (docs/benchmarks*) differ: a run that writes several records must not mark its later ones as run on
    changed code."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        changed = _git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/benchmarks*"
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if changed else head or None


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


def write(path: str | os.PathLike | None, figures: dict[str, Any], started: dict[str, Any]) -> None:
    """Write ``figures`` inside the envelope to ``path`` (nothing when ``path`` is None): ``started`` is
    ``provenance()`` taken when the run began, and the load at its end is added beside it."""
    if path is None:
        return
    import json

    record = {**started, **figures, "load_average_end": load_average()}
    Path(path).write_text(json.dumps(record, indent=1) + "\n")
    print(f"record written: {path}")

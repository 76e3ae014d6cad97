"""Never silently stand in for a real DeepSpeed, nor be silently replaced by one.

Both distributions are named ``deepspeed``: pip uninstalls one when it installs the other, so a normal
install holds exactly one. What can still go wrong, and is checked at ``import deepspeed``:

1. another ``deepspeed`` package on ``sys.path`` (a source checkout on ``PYTHONPATH``, an editable install,
   a second site-packages): which one Python imports then depends on path order;
2. a real DeepSpeed's files mixed into this package's folder (``pip install --ignore-installed`` or
   ``--no-deps --force-reinstall`` over it copies files without removing the other's);
3. a second ``deepspeed`` distribution record (dist-info) whose version is not ds's.

Each finding is one loud warning naming the paths and the fix. ``DS_DEEPSPEED_SHADOW_CHECK=0`` skips it.
"""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from pathlib import Path

from ds_config import env_flag

__all__ = ["DeepSpeedShadowWarning", "find_conflicts", "warn_conflicts"]

# files real DeepSpeed installs that ds never has (their presence here means a mixed install)
REAL_DEEPSPEED_MARKERS = ("git_version_info_installed.py", "ops/csrc", "inference/engine.py", "env_report.py")
FIX = (
    "Fix: keep exactly one. To use ds: `pip uninstall -y deepspeed` (repeat until pip says it is not "
    "installed), remove any DeepSpeed checkout from PYTHONPATH, then `pip install ./packages/deepspeed`. "
    "To use DeepSpeed: `pip uninstall -y deepspeed && pip install deepspeed==<version>`."
)


class DeepSpeedShadowWarning(UserWarning):
    """ds's ``deepspeed`` and a real DeepSpeed are both present; which one runs is an accident."""


def find_conflicts(own_dir: Path | None = None, path: list[str] | None = None) -> list[str]:
    """One sentence per sign of another DeepSpeed beside this package."""
    own_dir = (own_dir or Path(__file__).parent).resolve()
    problems = []
    for entry in path if path is not None else sys.path:
        candidate = Path(entry or ".") / "deepspeed"
        try:
            if (candidate / "__init__.py").is_file() and candidate.resolve() != own_dir:
                problems.append(f"another 'deepspeed' package is on sys.path at {candidate}")
        except OSError:
            continue
    mixed = [m for m in REAL_DEEPSPEED_MARKERS if (own_dir / m).exists()]
    if mixed:
        problems.append(
            f"real DeepSpeed's files are mixed into ds's package at {own_dir}: {', '.join(mixed)}"
        )
    for dist in importlib.metadata.distributions(name="deepspeed"):
        version = dist.version or ""
        if "+ds." not in version:
            problems.append(f"a real DeepSpeed distribution record (deepspeed {version}) is installed")
    return sorted(set(problems))


def warn_conflicts() -> list[str]:
    """Warn (once per import) about every conflict found; returns them."""
    if not env_flag("DS_DEEPSPEED_SHADOW_CHECK", True):
        return []
    problems = find_conflicts()
    if problems:
        warnings.warn(
            "`import deepspeed` resolved to ds (a reimplementation), but another DeepSpeed is installed "
            "beside it: "
            + "; ".join(problems)
            + ". Which one a process imports depends on path order. "
            + FIX,
            DeepSpeedShadowWarning,
            stacklevel=3,
        )
    return problems

"""Integration tests run real multi-rank jobs through ``ds-launch`` at the world size the nox session sets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def world_size() -> int:
    """The world size of this session (``DS_TEST_WORLD_SIZE``, default 2)."""
    return int(os.environ.get("DS_TEST_WORLD_SIZE", "2"))


def launch(
    script: str,
    *args: str,
    num_procs: int | None = None,
    timeout_s: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run ``script`` (a path, or a name under ``integration/scripts``) on ``num_procs`` ranks with ``ds-launch``."""
    exe = shutil.which("ds-launch", path=str(Path(sys.executable).parent)) or "ds-launch"
    path = Path(script) if Path(script).is_absolute() else HERE / "scripts" / script
    cmd = [exe, "--num_procs", str(num_procs or world_size()), str(path), *args]
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
            f"\n--- stderr\n{proc.stderr[-6000:]}"
        )
    return proc


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def ws() -> int:
    return world_size()

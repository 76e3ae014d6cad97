"""Helpers shared by the process tests: run the CLI, read rank records, find survivors in /proc."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"
DS_LAUNCH = [sys.executable, "-m", "ds_launch.cli"]


def mpi_env() -> dict[str, str]:
    env = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def records(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}


def survivors(marker: str) -> list[int]:
    """Pids of live processes whose command line contains ``marker`` (zombies count as gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_no_survivors(marker: str, within_s: float = 5.0) -> list[int]:
    """Survivors still there after ``within_s`` (PDEATHSIG and group kills take a moment)."""
    deadline = time.monotonic() + within_s
    while (left := survivors(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def run_cli(
    args: list[str], timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run([*DS_LAUNCH, *args], capture_output=True, text=True, timeout=timeout_s, env=env)

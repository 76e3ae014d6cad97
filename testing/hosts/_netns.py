"""The namespace plumbing under :class:`hosts.Cluster`: one run's state folder, its namespaces and their teardown.

A run owns ``<root>/<prefix>/`` (``root``: ``$DS_TEST_HOSTS_DIR`` or ``/var/tmp/ds-test-hosts``, outside /tmp so
that hosts with a private /tmp see it) and every network namespace whose name starts with ``<prefix>-``. The folder is written before any namespace is made, with the
owner's pid and start time in it, so a namespace with the run's prefix and no live owner is always stale:
:func:`clean_stale` removes it, and :func:`teardown` is the one way a run's hosts go away (at close, from the
reaper when the owner died, or from the next run's stale sweep).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PREFIX_STEM = "dsth"  # every run's prefix starts with it: dsth<6 hex>
OWNER_FILE = "owner.json"


def state_root() -> Path:
    return Path(os.environ.get("DS_TEST_HOSTS_DIR", "/var/tmp/ds-test-hosts"))


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS``; a failure raises with ip's own message (it names the device or namespace)."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_netns() -> list[str]:
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    """Every live process whose network namespace is ``netns`` (what ``ip netns pids`` reads from /proc)."""
    out = ip("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split()]


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces; the fields after its closing parenthesis do not
    return stat.rsplit(")", 1)[1].split()[19]


def owner_record() -> dict:
    return {"pid": os.getpid(), "start": _start_time(os.getpid())}


def owner_alive(record: dict) -> bool:
    start = _start_time(int(record["pid"]))
    return start is not None and start == record.get("start")


def kill_pids(pids: list[int], timeout_s: float = 10.0) -> None:
    """SIGKILL ``pids`` and wait until none is left (a killed child of ours is gone once it is a zombie)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def teardown(prefix: str) -> None:
    """Kill every process in the run's namespaces, delete the namespaces (their veths and bridge go with
    them) and the state folder. Safe to call twice, and from another process."""
    mine = [ns for ns in list_netns() if ns.startswith(prefix + "-")]
    # processes first: a namespace with a live process in it outlives `ip netns del`
    for _ in range(3):  # a process forking while we kill: go round again
        pids = sorted({p for ns in mine for p in netns_pids(ns)})
        if not pids:
            break
        kill_pids(pids)
    for ns in mine:
        ip("netns", "del", ns, check=False)
    shutil.rmtree(state_root() / prefix, ignore_errors=True)


def clean_stale() -> list[str]:
    """Tear down every earlier run whose owner is gone (killed tests, crashed workers). Returns their prefixes."""
    root = state_root()
    stale: set[str] = set()
    live: set[str] = set()
    if root.is_dir():
        for run in root.iterdir():
            if not run.name.startswith(PREFIX_STEM):
                continue
            try:
                record = json.loads((run / OWNER_FILE).read_text())
            except (OSError, ValueError):
                # a folder without an owner file is one being made this instant, or the remains of a
                # crash between mkdir and write: only the latter is old
                if time.time() - run.stat().st_mtime > 60:
                    stale.add(run.name)
                continue
            (live if owner_alive(record) else stale).add(run.name)
    for ns in list_netns():
        prefix = ns.split("-", 1)[0]
        if prefix.startswith(PREFIX_STEM) and prefix not in live and not (root / prefix).exists():
            stale.add(prefix)
    for prefix in sorted(stale):
        teardown(prefix)
    return sorted(stale)

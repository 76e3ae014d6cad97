"""Run child processes as one job: the first failure, a signal or the timeout ends all of them.

Each child starts in its own session, so it and everything it spawns (data-loader workers, a
shell wrapper's children) form one process group that can be signalled as a whole. Children also
ask the kernel to kill them if the launcher dies, so even ``kill -9`` of the launcher leaves no
rank running.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["ChildSpec", "run_supervised", "describe_exit", "POLL_INTERVAL_S"]

POLL_INTERVAL_S = 0.05
EXIT_TIMEOUT = 124  # what coreutils `timeout` returns, so scripts can tell a timeout from a crash
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildSpec:
    """One process of the job: a display name ("rank 3"), its argv and its full environment."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def describe_exit(returncode: int) -> str:
    """'exited with code 3' or 'was killed by signal SIGKILL (9)' for a Popen return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {name} ({-returncode})"
    return f"exited with code {returncode}"


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _die_with_launcher(launcher_pid: int) -> None:
    """Runs in the child between fork and exec: tie its life to the launcher's."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
        os._exit(1)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # pgid == pid: each child leads its own session
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is already gone


def _stop_all(procs: Sequence[subprocess.Popen], first_signal: int, grace_s: float) -> None:
    """``first_signal`` to every group, SIGKILL to what is left after ``grace_s``, then reap."""
    for proc in procs:
        _signal_group(proc, first_signal)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_INTERVAL_S)
    for proc in procs:
        # Also after a clean exit: a rank's own children may survive it, and must not be orphaned.
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        proc.wait()


class _Signals:
    """Records SIGINT/SIGTERM/SIGHUP to the launcher instead of dying, so they can be forwarded."""

    FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        for sig in self.FORWARDED:
            self._previous[sig] = signal.signal(sig, self._record)
        return self

    def _record(self, signum: int, frame: object) -> None:
        self.received = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _log(message: str) -> None:
    print(f"ds-launch: {message}", file=sys.stderr, flush=True)


def run_supervised(specs: Sequence[ChildSpec], timeout_s: float | None = None, grace_s: float = 5.0) -> int:
    """Start every child, wait for all; return 0, or the failing child's code (128+N for signal N).

    When a child exits non-zero or dies from a signal, the others get SIGTERM, then SIGKILL after
    ``grace_s``. A SIGINT/SIGTERM/SIGHUP to the launcher is forwarded to every child's group the
    same way (exit code 128+signal). After ``timeout_s`` seconds the job is stopped (exit 124).
    """
    launcher_pid = os.getpid()
    procs: list[subprocess.Popen] = []
    with _Signals() as signals:
        try:
            for spec in specs:
                procs.append(
                    subprocess.Popen(
                        spec.argv,
                        env=spec.env,
                        start_new_session=True,
                        preexec_fn=lambda: _die_with_launcher(launcher_pid),
                    )
                )
            return _watch(specs, procs, signals, timeout_s, grace_s)
        finally:
            _stop_all(procs, signal.SIGTERM, grace_s if any(p.poll() is None for p in procs) else 0.0)


def _watch(
    specs: Sequence[ChildSpec],
    procs: list[subprocess.Popen],
    signals: _Signals,
    timeout_s: float | None,
    grace_s: float,
) -> int:
    deadline = None if not timeout_s else time.monotonic() + timeout_s
    while True:
        if signals.received is not None:
            name = signal.Signals(signals.received).name
            _log(f"received {name}; forwarding it to all {len(procs)} processes")
            _stop_all(procs, signals.received, grace_s)
            return 128 + signals.received
        codes = [p.poll() for p in procs]
        for spec, code in zip(specs, codes):
            if code:
                others = sum(c is None for c in codes)
                _log(f"{spec.name} {describe_exit(code)}; stopping the other {others} running process(es)")
                _stop_all(procs, signal.SIGTERM, grace_s)
                return _exit_code(code)
        if all(code == 0 for code in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _log(f"the job did not finish within --timeout {timeout_s:g} s; stopping all processes")
            _stop_all(procs, signal.SIGTERM, grace_s)
            return EXIT_TIMEOUT
        time.sleep(POLL_INTERVAL_S)

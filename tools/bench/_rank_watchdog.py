"""Run N rank processes under a memory watchdog: the sum of their RSS may not pass a budget.

This machine has no swap: a rank that grows past the free memory does not fail alone, the kernel's OOM
killer picks a victim, possibly another engineer's process. So the parent samples the resident set of
every rank (and of any children a rank starts) every ``SAMPLE_S`` seconds from /proc and kills the whole
run (SIGKILL, every rank) the moment the total passes the budget. A rank that dies on its own ends the
run as well: the others would wait in a collective until gloo's timeout.

Only the standard library: psutil is not in the venv, and /proc says all we need.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
SAMPLE_S = 0.2


def meminfo_bytes(key: str) -> int:
    """A /proc/meminfo field (e.g. ``MemAvailable``) in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"no {key} in /proc/meminfo: the watchdog needs Linux")


def used_by_others_bytes() -> int:
    """Memory the rest of the machine holds now (total - available): what a run cannot count on."""
    return meminfo_bytes("MemTotal") - meminfo_bytes("MemAvailable")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a vanished process has none)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def rss_bytes(pid: int) -> int:
    """VmRSS of one process; 0 once it is gone (or a zombie, which has no memory left)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def total_rss_bytes(pids: list[int]) -> int:
    """Sum of the resident sets of ``pids`` and their descendants (shared library pages count per process,
    as ``ps`` and the brief's "sum of the ranks' RSS" do)."""
    return sum(rss_bytes(p) for pid in pids for p in set(_descendants(pid)))


@dataclass
class RunOutcome:
    """How a watched run ended. ``reason`` is empty when every rank exited 0."""

    ok: bool
    reason: str = ""
    peak_total_rss_bytes: int = 0
    wall_s: float = 0.0
    returncodes: list[int | None] = field(default_factory=list)
    samples: list[tuple[float, int]] = field(default_factory=list)  # (time.time(), total RSS bytes)


def classify_failure(returncode: int, stderr_tail: str) -> tuple[str, bool]:
    """(reason, is_out_of_memory) for a rank that exited on its own with ``returncode``.

    Out of memory is judged the same way for every implementation: killed by SIGKILL (the kernel's OOM
    killer; the watchdog's own kills are reported before this is asked), a ``MemoryError``, or a
    RuntimeError from an allocator. Anything else is an error in the run, not a size that does not fit.
    """
    if returncode == -signal.SIGKILL:
        return "killed by SIGKILL (the kernel's OOM killer?)", True
    lines = [line.strip() for line in stderr_tail.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("MemoryError"):
            return line, True
        if line.startswith("RuntimeError") and re.search(r"alloc|out of memory", line, re.IGNORECASE):
            return line, True
    return f"exit code {returncode}: {lines[-1] if lines else '(no output)'}", False


def log_tail(path: Path, nbytes: int = 4000) -> str:
    """The last ``nbytes`` of a rank's log, as text."""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - nbytes))
        return f.read().decode(errors="replace")


def run_watched(
    cmds: list[list[str]], env: dict[str, str], logs: Path, budget_bytes: int, timeout_s: float
) -> tuple[RunOutcome, bool]:
    """Start one process per command (rank r runs ``cmds[r]`` with RANK=r), watch them, return
    (outcome, out_of_memory). stdout and stderr of rank r go to ``logs/rank{r}.out|err``."""
    logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank, cmd in enumerate(cmds):
        out, err = (logs / f"rank{rank}.out").open("wb"), (logs / f"rank{rank}.err").open("wb")
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                                      stdout=out, stderr=err))  # fmt: skip
        out.close(), err.close()
    start, peak, samples = time.monotonic(), 0, []
    outcome, oom = None, False
    try:
        while outcome is None:
            codes = [p.poll() for p in procs]
            total = total_rss_bytes([p.pid for p, c in zip(procs, codes) if c is None])
            peak = max(peak, total)
            samples.append((time.time(), total))
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if total > budget_bytes:
                outcome, oom = RunOutcome(False, f"total RSS {total / GIB:.2f} GiB passed the budget "
                                          f"{budget_bytes / GIB:.2f} GiB: killed by the watchdog"), True  # fmt: skip
            elif failed:
                rank, code = failed[0]
                reason, oom = classify_failure(code, log_tail(logs / f"rank{rank}.err"))
                outcome = RunOutcome(False, f"rank {rank}: {reason}")
            elif all(c == 0 for c in codes):
                outcome = RunOutcome(True)
            elif time.monotonic() - start > timeout_s:
                outcome = RunOutcome(False, f"timed out after {timeout_s:.0f} s")
            else:
                time.sleep(SAMPLE_S)
    finally:  # never leave a rank behind, whatever happened here, nor what a rank started (a compiler
        # building an op, an I/O helper): orphaned, it would hold memory and the lock of the build it ran
        for pid in [d for p in procs if p.poll() is None for d in _descendants(p.pid)[1:]]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()
    outcome.peak_total_rss_bytes = peak
    outcome.wall_s = time.monotonic() - start
    outcome.returncodes = [p.returncode for p in procs]
    outcome.samples = samples
    return outcome, oom

"""Run child processes as one job: the first failure, a signal or the timeout ends all of them.

Each child starts in its own session, so it and everything it spawns (data-loader workers, a
shell wrapper's children) form one process group that can be signalled as a whole. Children also
ask the kernel to kill them if the launcher dies, so even ``kill -9`` of the launcher leaves no
rank running.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ._monitor import Fault, Monitor
from ._output import TAIL_LINES, OutputForwarder
from ._report import (
    ProcessExit,
    describe_exit,
    first_failure,
    mpi_runtime_signals,
    process_report,
    rank_ends,
    read_events,
    report,
)

__all__ = ["ChildSpec", "Job", "run_supervised", "describe_exit", "die_with_parent", "POLL_INTERVAL_S"]

POLL_INTERVAL_S = 0.05
EXIT_TIMEOUT = 124  # what coreutils `timeout` returns, so scripts can tell a timeout from a crash
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class ChildSpec:
    """One process of the job: a display name ("rank 3"), its argv and its full environment.

    ``rank`` is the global rank the process runs, or None for a process that starts ranks itself
    (mpirun)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    rank: int | None = None


@dataclass(frozen=True)
class Job:
    """What the launcher needs to report on the ranks: how many, where they record their end, and the
    monitor that hears their heartbeats and ends (over the network: ranks on every host).

    ``ranks``: the ranks this launcher started when it runs one host's share of a larger world (the
    others are reported by their own hosts); empty: all of them. A world size of 0 means the children
    are not ranks but launchers of ranks, one per host: the report names the processes (the monitor,
    if any, still hears every rank)."""

    world_size: int
    events_dir: Path
    tag_output: bool = False
    monitor: Monitor | None = None
    ranks: tuple[int, ...] = ()


_FAULTS = {
    "failed": "a rank failed",
    "lost": "ranks were lost (their connections closed without a word)",
    "silent": "ranks went silent (no heartbeat)",
    "stalled": "no rank made progress",
}


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _die_with_launcher(launcher_pid: int) -> None:
    """Runs in the child between fork and exec: tie its life to the launcher's."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher_pid:  # the launcher died before prctl took effect
        os._exit(1)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies (a remote shell's session
    ending): the launcher then stops its ranks as for a SIGTERM to it. Exits at once if the parent is
    already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if os.getppid() == 1:
        sys.exit(128 + sig)


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, children before grandchildren (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone while we looked
            children.setdefault(ppid, []).append(int(entry))
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found.extend(frontier)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def terminate_process_tree(pid: int, grace_s: float = 30.0) -> None:
    """SIGTERM ``pid`` and all its descendants, SIGKILL whatever is left after ``grace_s`` (Linux)."""
    tree = [*_descendants(pid), pid]
    for p in tree:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(POLL_INTERVAL_S)
    for p in tree:
        if _alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # pgid == pid: each child leads its own session
    except (ProcessLookupError, PermissionError):
        pass  # the whole group is already gone


def _stop_all(procs: Sequence[subprocess.Popen], first_signal: int, grace_s: float) -> int:
    """``first_signal`` to every group, SIGKILL to what is left after ``grace_s``, then reap; returns
    when the SIGKILL was sent (``time.monotonic_ns``)."""
    for proc in procs:
        _signal_group(proc, first_signal)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(POLL_INTERVAL_S)
    kill_t_ns = time.monotonic_ns()
    for proc in procs:
        # Also after a clean exit: a rank's own children may survive it, and must not be orphaned.
        _signal_group(proc, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    return kill_t_ns


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


def run_supervised(
    specs: Sequence[ChildSpec], job: Job, timeout_s: float | None = None, grace_s: float = 5.0
) -> int:
    """Start every child, wait for all; return 0, or the code of the rank that failed first.

    Children's output is forwarded line by line (``_output``). When a child exits non-zero or dies
    from a signal, the others get SIGTERM, then SIGKILL after ``grace_s``, and once all have ended
    the report names the rank that failed first (``_report``), with its last stderr lines. A
    SIGINT/SIGTERM/SIGHUP to the launcher is forwarded to every child's group the same way (exit
    code 128+signal). After ``timeout_s`` seconds the job is stopped (exit 124).
    """
    launcher_pid = os.getpid()
    output = OutputForwarder(job.tag_output)
    procs: list[subprocess.Popen] = []
    exits: queue.Queue[tuple[int, ProcessExit]] = queue.Queue()
    with _Signals() as signals:
        try:
            for spec in specs:
                # mpirun's stderr carries every rank's, and its own message about them comes late.
                out_w, err_w = output.pipes_for(spec.name, TAIL_LINES if spec.rank is not None else 1000)
                try:
                    proc = subprocess.Popen(
                        spec.argv,
                        env=spec.env,
                        stdout=out_w,
                        stderr=err_w,
                        start_new_session=True,
                        preexec_fn=lambda: _die_with_launcher(launcher_pid),
                    )
                finally:
                    os.close(out_w)  # the child holds them now; EOF comes when it (and its own children) end
                    os.close(err_w)
                procs.append(proc)
                threading.Thread(target=_reap, args=(len(procs) - 1, proc, exits), daemon=True).start()
            output.start()
            watch = _Watch(specs, procs, exits, output, job.monitor)
            code = watch.run(signals, timeout_s, grace_s)
        finally:
            _stop_all(procs, signal.SIGTERM, grace_s if any(p.poll() is None for p in procs) else 0.0)
            output.close()
    if watch.fault is not None and watch.fault.kind != "failed":  # a failed rank: the report below says it
        for line in watch.fault.lines:
            _print_log(line)
    if watch.failed:
        return _report_failure(specs, job, watch, output, code)
    if code == 0 and job.monitor is not None and not job.monitor.exits_seen:
        return _check_every_rank_succeeded(specs, job.monitor)
    return code


def _check_every_rank_succeeded(specs: Sequence[ChildSpec], monitor: Monitor) -> int:
    """A job whose processes all exited 0 succeeded only if every rank said it ended with code 0: mpirun
    exits 0 when a host's daemon is lost ("A daemon failed to report back"), with ranks that never ended."""
    monitor.settle()
    missing = monitor.unaccounted()
    if not missing:
        return 0
    _print_log(
        f"{specs[0].name} exited 0, but not every rank reported ending with code 0, so the job failed:"
    )
    for line in missing:
        _print_log("  " + line)
    return 1


def _reap(index: int, proc: subprocess.Popen, exits: queue.Queue) -> None:
    """Wait for one child in its own thread, so its exit is timed when it happens, not at a poll."""
    returncode = proc.wait()
    exits.put((index, ProcessExit(time.monotonic_ns(), returncode)))


class _Watch:
    """The launcher's loop: exits, forwarded signals and the timeout; records when it stopped the job."""

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        procs: list[subprocess.Popen],
        exits: queue.Queue[tuple[int, ProcessExit]],
        output: OutputForwarder,
        monitor: Monitor | None = None,
    ) -> None:
        self.specs, self.procs, self.exits, self.output = specs, procs, exits, output
        self.monitor = monitor
        self.fault: Fault | None = None  # what the monitor saw, when it ended the job
        self.seen: dict[int, ProcessExit] = {}  # by index into specs
        self.stop_t_ns: int | None = None
        self.kill_t_ns: int | None = None
        self.failed = False

    def _stop(self, sig: int, grace_s: float) -> None:
        self.stop_t_ns = time.monotonic_ns()
        self.kill_t_ns = _stop_all(self.procs, sig, grace_s)
        while len(self.seen) < len(self.procs):  # every reaper reports right after the reaping above
            index, ended = self.exits.get()
            self.seen[index] = ended

    def run(self, signals: _Signals, timeout_s: float | None, grace_s: float) -> int:
        deadline = None if not timeout_s else time.monotonic() + timeout_s
        while True:
            if signals.received is not None:
                name = signal.Signals(signals.received).name
                self.output.log(f"received {name}; forwarding it to all {len(self.procs)} processes")
                self._stop(signals.received, grace_s)
                return 128 + signals.received
            try:
                index, ended = self.exits.get(timeout=POLL_INTERVAL_S)
                self.seen[index] = ended
            except queue.Empty:
                pass
            else:
                if ended.returncode != 0:
                    self.failed = True
                    spec, running = self.specs[index], len(self.procs) - len(self.seen)
                    # Not named here: the first rank to exit is often not the first to fail.
                    who = (
                        "a rank failed"
                        if spec.rank is not None
                        else f"{spec.name} {describe_exit(ended.returncode)}"
                    )
                    stopping = f"; stopping the other {running} running process(es)" if running else ""
                    self.output.log(f"{who}{stopping}; the report follows once all have ended")
                    self._stop(signal.SIGTERM, grace_s)
                    return _exit_code(ended.returncode)
                if len(self.seen) == len(self.procs):
                    return 0
            fault = self.monitor.check() if self.monitor is not None else None
            if fault is not None:
                self.failed, self.fault = True, fault
                self.output.log(
                    f"{_FAULTS[fault.kind]}; stopping all {len(self.procs)} processes; the report follows"
                )
                self._stop(signal.SIGTERM, grace_s)
                return fault.code
            if deadline is not None and time.monotonic() > deadline:
                self.output.log(
                    f"the job did not finish within --timeout {timeout_s:g} s; stopping all processes"
                )
                self._stop(signal.SIGTERM, grace_s)
                return EXIT_TIMEOUT


def _report_failure(
    specs: Sequence[ChildSpec], job: Job, watch: _Watch, output: OutputForwarder, fallback_code: int
) -> int:
    """Print which rank failed first and what followed; return that rank's exit code."""
    if job.world_size == 0:  # one launcher per host: name the hosts
        tail_lines = {spec.name: output.tail(spec.name) for spec in specs}
        ended = [(spec.name, watch.seen[i]) for i, spec in enumerate(specs) if i in watch.seen]
        host_lines = process_report(ended, tail_lines, watch.stop_t_ns)
        for line in host_lines:
            _print_log(line)
        if host_lines or job.monitor is None:
            return fallback_code
        # no host failed before ds-launch stopped them (the monitor saw the fault): the ranks it heard say
        job = dataclasses.replace(job, world_size=job.monitor.world_size)
    exits = {
        spec.rank: watch.seen[i] for i, spec in enumerate(specs) if spec.rank is not None and i in watch.seen
    }
    said = {}
    for spec in specs:
        if spec.rank is None:
            said.update(mpi_runtime_signals(output.tail(spec.name)))
    events = read_events(job.events_dir)
    if job.monitor is not None:
        job.monitor.settle(timeout_s=1.0)
        events.update(job.monitor.ends())  # ranks on other hosts; ordered by when the launcher heard them
    # After a fault only the monitor sees (silence, a stall), the ranks without a record were stopped by
    # ds-launch rather than failed; a lost rank is named by the fault itself
    on_its_own = watch.fault is None or watch.fault.kind in ("failed", "lost")
    ends = rank_ends(job.world_size, events, exits, watch.stop_t_ns, on_its_own, said, watch.kill_t_ns)
    if job.ranks:
        ends = [end for end in ends if end.rank in job.ranks]
    names = {spec.rank: spec.name for spec in specs if spec.rank is not None}
    # Under mpirun the ranks' stderr reaches the launcher merged: no tail per rank (None).
    hosts = job.monitor.hosts() if job.monitor is not None else {}
    roles = {rank: str(e["role"]) for rank, e in events.items() if e.get("role")}
    roles.update(job.monitor.roles() if job.monitor is not None else {})
    for line in report(ends, lambda rank: output.tail(names[rank]) if rank in names else None, hosts, roles):
        _print_log(line)
    if len(set(hosts.values())) > 1:
        _print_log("Ranks by host: " + _ranks_by_host(hosts))
    first = first_failure(ends)
    return fallback_code if first is None or first.code is None else _exit_code(first.code)


def _ranks_by_host(hosts: dict[int, str]) -> str:
    by_host: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        by_host.setdefault(hosts[rank], []).append(rank)
    return "; ".join(f"{host}: {', '.join(map(str, ranks))}" for host, ranks in by_host.items())


def _print_log(message: str) -> None:
    print(f"ds-launch: {message}", file=sys.stderr, flush=True)

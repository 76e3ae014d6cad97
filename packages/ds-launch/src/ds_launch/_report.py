"""Which rank failed first, and how to say so.

A failed rank often outlives the peers it made fail: its at-exit teardown runs after it closed its
connections, while the peers, which saw those connections close, die at once. So the order in
which the launcher sees processes exit is not the order of failure. Each rank records how it ends
before its teardown (``_rank_entry``); those records, with the exits the launcher saw, give the
order. A rank whose error says a peer went away is named after any rank that failed on its own.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "RankEnd",
    "ProcessExit",
    "describe_exit",
    "read_events",
    "mpi_runtime_signals",
    "rank_ends",
    "first_failure",
    "report",
    "process_report",
    "PEER_LOST_FIRST",
]

# pdsh's line for a host whose command ended non-zero ("pdsh@top: node1: ssh exited with exit code 3")
_PDSH_HOST_EXIT = re.compile(r"^pdsh@\S+: (\S+): .*exited with exit code (\d+)")

_HOST_TAIL_LINES = 30  # a host's launcher's own report of its ranks is about 10 lines

# How report() words a first failure that only lost a peer: a host whose ranks all failed that way is
# named after one whose rank failed on its own (process_report).
PEER_LOST_FIRST = ", after losing a peer: the first rank to fail."


def describe_exit(returncode: int) -> str:
    """'exited with code 3' or 'was killed by signal SIGKILL (9)' for a Popen return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {name} ({-returncode})"
    return f"exited with code {returncode}"


@dataclass(frozen=True)
class ProcessExit:
    """A rank process's end as the launcher saw it."""

    t_ns: int  # time.monotonic_ns() when the launcher reaped it
    returncode: int  # Popen's: negative for a signal


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, merged from its own record and what the launcher saw."""

    rank: int
    failed: bool  # ended non-zero (or without a record, in a failed mpirun job) before being stopped
    how: str  # "exited with code 3", "was killed by signal SIGKILL (9)", ...
    t_ns: int | None = None  # when it began to end; None when unknown
    peer_lost: bool = False  # its error says a peer went away: probably a consequence
    code: int | None = None  # its exit status (negative: signal); None when unknown
    traceback: Sequence[str] = field(default_factory=tuple)
    config_error: str | None = None  # the text of the ds_config ConfigError it raised, if it did


def read_events(directory: Path) -> dict[int, dict]:
    """The records ranks wrote in ``directory`` (``rank<N>.json``), by rank."""
    events = {}
    for path in directory.glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
            events[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue  # a record cut short by a kill says nothing reliable
    return events


# Open MPI's (mpirun/prterun) message for the first rank it saw die of a signal.
_MPI_SIGNAL_MESSAGE = re.compile(
    r"noticed that process rank (\d+) with PID \d+ on node \S+ exited on\s+signal (\d+)"
)


def mpi_runtime_signals(lines: Sequence[str]) -> dict[int, int]:
    """``{rank: -signal}`` for the ranks mpirun's own messages say were killed by a signal."""
    found = _MPI_SIGNAL_MESSAGE.finditer(" ".join(lines))
    return {int(m.group(1)): -int(m.group(2)) for m in found}


def rank_ends(
    world_size: int,
    events: Mapping[int, dict],
    exits: Mapping[int, ProcessExit],
    stop_t_ns: int | None,
    job_failed: bool,
    runtime_said: Mapping[int, int] | None = None,
    kill_t_ns: int | None = None,
) -> list[RankEnd]:
    """Every rank's end. ``exits`` is empty when another program (mpirun) started the ranks; what
    that program said (``runtime_said``: rank -> return code) fills in for ranks without a record.
    ``stop_t_ns`` is when the launcher began stopping ranks (None: it did not), ``kill_t_ns`` when it
    sent SIGKILL to what was left (None: unknown)."""
    runtime_said = runtime_said or {}

    def before_stop(t_ns: int) -> bool:
        return stop_t_ns is None or t_ns < stop_t_ns

    def own_end(seen: ProcessExit) -> bool:
        """A SIGKILL before the launcher sent one was not the launcher's (it stops with SIGTERM first),
        even when the exit was timed after the stop began: its reaper thread can run late on a loaded
        machine, after a peer that lost it has already exited."""
        if before_stop(seen.t_ns):
            return True
        return kill_t_ns is not None and seen.returncode == -signal.SIGKILL and seen.t_ns < kill_t_ns

    ends = []
    for rank in range(world_size):
        event, seen = events.get(rank), exits.get(rank)
        if event is not None and event["code"] != 0 and before_stop(event["t_ns"]):
            how = describe_exit(event["code"])
            if event.get("traceback"):
                how = how + f" ({_shorten(event['traceback'][-1].strip())})"
            ends.append(
                RankEnd(
                    rank,
                    True,
                    how,
                    event["t_ns"],
                    bool(event.get("peer_lost")),
                    event["code"],
                    tuple(event.get("traceback", ())),
                    event.get("config_error"),
                )
            )
        elif seen is not None and seen.returncode != 0:
            how = describe_exit(seen.returncode)
            ends.append(RankEnd(rank, own_end(seen), how, seen.t_ns, code=seen.returncode))
        elif event is None and seen is None and rank in runtime_said:
            ends.append(RankEnd(rank, True, describe_exit(runtime_said[rank]), code=runtime_said[rank]))
        elif event is None and seen is None:
            how = "ended without a record of how (a signal, or os._exit; the MPI runtime's message says more)"
            ends.append(RankEnd(rank, job_failed, how if job_failed else "ended"))
        else:
            ends.append(RankEnd(rank, False, describe_exit(0), code=0))
    return ends


def first_failure(ends: Sequence[RankEnd]) -> RankEnd | None:
    """The rank that failed on its own earliest; ranks that only lost a peer come last."""
    failed = [e for e in ends if e.failed]
    if not failed:
        return None
    return min(failed, key=lambda e: (e.peer_lost, e.t_ns is None, e.code is None, e.t_ns or 0, e.rank))


def report(
    ends: Sequence[RankEnd],
    tail_of: Callable[[int], list[str] | None],
    hosts: Mapping[int, str] | None = None,
    roles: Mapping[int, str] | None = None,
) -> list[str]:
    """Lines for the user: the first failure with its last stderr lines, then what followed.

    ``tail_of(rank)`` gives a rank's last stderr lines, or None where the launcher cannot tell
    ranks' stderr apart (under mpirun); the traceback the rank recorded stands in then. When the
    first failure is a ConfigError, each distinct ConfigError message is shown once, naming the ranks
    that raised it, without a traceback or stderr lines (those ranks printed nothing for it). ``hosts``
    (rank -> host, from the monitor) puts the host beside each rank named when the job spans hosts; ``roles``
    (rank -> what the rank said it is, ``ds_launch.set_rank_role``: "pipeline stage 1") goes beside it too."""
    first = first_failure(ends)
    if first is None:
        return []
    if first.config_error is not None:
        return _config_errors(ends, first)
    where = hosts if hosts and len(set(hosts.values())) > 1 else {}
    on = {rank: f" on {host}" for rank, host in where.items()}
    for rank, role in (roles or {}).items():
        on[rank] = f" [{role}]" + on.get(rank, "")
    lines = [
        f"rank {first.rank}{on.get(first.rank, '')} {first.how}"
        + (PEER_LOST_FIRST if first.peer_lost else ": the first rank to fail.")
    ]
    tail = tail_of(first.rank)
    if tail:
        lines.append(f"The last lines rank {first.rank} wrote to stderr:")
    elif first.traceback:
        tail = list(first.traceback)
        lines.append(f"The end of the traceback rank {first.rank} recorded:")
    elif tail is not None:
        lines.append(f"rank {first.rank} wrote nothing to stderr.")
    lines += [f"  | {ln}" for chunk in tail or () for ln in chunk.splitlines()]
    return lines + _what_followed(ends, [first], on)


def _config_errors(ends: Sequence[RankEnd], first: RankEnd) -> list[str]:
    """Each ConfigError message once (the first failure's first), with the ranks that raised it."""
    by_message: dict[str, list[RankEnd]] = {first.config_error or "": []}
    for end in ends:
        if end.failed and end.config_error is not None:
            by_message.setdefault(end.config_error, []).append(end)
    lines = []
    for message, raised in by_message.items():
        codes = sorted({e.code for e in raised if e.code is not None})
        status = f"exit code {codes[0]}" if len(codes) == 1 else "exit codes " + ", ".join(map(str, codes))
        lines.append(f"{_ranks([e.rank for e in raised])} raised ConfigError ({status}):")
        lines += [f"  | {ln}" for ln in message.splitlines()]
    return lines + _what_followed(ends, [e for e in ends if e.failed and e.config_error is not None])


def _ranks(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0 and 1', 'ranks 0, 1 and 2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _what_followed(
    ends: Sequence[RankEnd], shown: Sequence[RankEnd], on: Mapping[int, str] | None = None
) -> list[str]:
    """The ranks that failed besides those ``shown``, then the ranks the launcher stopped."""
    on = on or {}
    lines = []
    others = [e for e in ends if e.failed and all(e is not s for s in shown)]
    if others:
        others.sort(key=lambda e: (e.t_ns is None, e.t_ns or 0, e.rank))
        lines.append(
            "Then: " + "; ".join(f"rank {e.rank}{on.get(e.rank, '')} {_short(e)}" for e in others) + "."
        )
    stopped = [e for e in ends if not e.failed and e.code != 0 and e.code is not None]
    if stopped:
        lines.append(
            "Stopped by ds-launch because of it: "
            + ", ".join(f"rank {e.rank}{on.get(e.rank, '')} ({e.how})" for e in stopped)
            + "."
        )
    return lines


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(end: RankEnd) -> str:
    how = end.how.split(" (", 1)[0] if end.traceback else end.how
    return how + (", after losing a peer" if end.peer_lost else "")


def process_report(
    ended: Sequence[tuple[str, ProcessExit]], tails: Mapping[str, list[str]], stop_t_ns: int | None
) -> list[str]:
    """Lines for a job whose children each launched the ranks of one host (``host h1 (ranks 0-1)``):
    the host that failed first with the last lines it wrote to stderr (its own launcher's report of its
    ranks ends there), then the others that failed, then those ds-launch stopped.

    Hosts are ordered by when they ended, except that one whose report says its first rank only lost a
    peer comes after any whose rank failed on its own (its peers' hosts can end first)."""
    failed = [(n, e) for n, e in ended if e.returncode != 0 and (stop_t_ns is None or e.t_ns < stop_t_ns)]
    if not failed:
        return []
    failed.sort(key=lambda ne: (any(PEER_LOST_FIRST in ln for ln in tails.get(ne[0], ())), ne[1].t_ns))
    name, first = failed[0]
    tail = tails.get(name) or []
    by_pdsh = [f"{m.group(1)} (exit code {m.group(2)})" for ln in tail if (m := _PDSH_HOST_EXIT.search(ln))]
    if by_pdsh:  # one pdsh for all hosts: its own lines say which ended non-zero, in the order it saw them
        lines = [f"{name} {describe_exit(first.returncode)}; the hosts that failed: {', '.join(by_pdsh)}."]
    else:
        lines = [f"{name} {describe_exit(first.returncode)}: the first host to fail."]
    lines.append(f"The last lines {name} wrote to stderr:" if tail else f"{name} wrote nothing to stderr.")
    lines += [f"  | {ln}" for ln in tail[-_HOST_TAIL_LINES:]]
    if failed[1:]:
        lines.append("Then: " + "; ".join(f"{n} {describe_exit(e.returncode)}" for n, e in failed[1:]) + ".")
    stopped = [(n, e) for n, e in ended if (n, e) not in failed and e.returncode != 0]
    if stopped:
        lines.append(
            "Stopped by ds-launch because of it: "
            + ", ".join(f"{n} ({describe_exit(e.returncode)})" for n, e in stopped)
            + "."
        )
    return lines

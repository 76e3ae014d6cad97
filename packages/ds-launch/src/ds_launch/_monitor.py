"""The launcher's side of the ranks' heartbeats (``_heartbeat.py``): who is alive, on which host, and how each
rank ended, over a TCP connection per rank, so that it works across hosts without a shared filesystem.

Three faults end a job that the processes' exit codes alone would let run, or let pass as a success:

- **lost**: a rank's connection closed without its end record: the process was killed (SIGKILL, the OOM
  killer), or its host went down;
- **silent**: no heartbeat from a rank for ``heartbeat_timeout_s``: its host is unreachable (a network
  partition, a host that froze) or the process is stopped;
- **stalled**: no rank made progress for ``stall_timeout_s``: every live rank is blocked (one rank hangs
  in a sleep, a lock or a mismatched collective, and the others wait for it in a collective). Progress is
  CPU time of a rank's main thread or bytes it read or wrote, so a long computation, on one rank or all,
  or a slow checkpoint write never counts as a stall; a rank blocked in a collective makes none.

And at the end, a job succeeds only if every rank reported ending with code 0.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._netif import ipv4_interfaces

__all__ = ["Fault", "Monitor", "DEFAULT_HEARTBEAT_TIMEOUT_S", "DEFAULT_STALL_TIMEOUT_S"]

DEFAULT_HEARTBEAT_TIMEOUT_S = 20.0  # 20 missed beats: a loaded machine delays a beat by seconds, not 20
DEFAULT_STALL_TIMEOUT_S = 45.0  # with the 60 s goal for a hang: 45 s of no progress, then the stop
_PROGRESS_CPU_S = 0.2  # more main-thread CPU than a blocked rank spends (a blocked gloo wait: ~0.002 s/s)
_PROGRESS_IO_BYTES = 1 << 16
_MISSED_BEATS_S = 3.0  # three beats (of one a second) missed
_LOST_GRACE_S = 3.0


@dataclass
class _Rank:
    rank: int
    host: str
    pid: int
    last_beat: float
    progress_t: float
    cpu_s: float = 0.0
    io_bytes: int = 0
    mark: tuple[float, int] = (0.0, 0)  # cpu_s, io_bytes when progress was last seen
    where: str = ""
    role: str = ""  # what the rank said it is ("pipeline stage 1"; ds_launch.set_rank_role)
    end: dict | None = None
    heard_t: float = 0.0  # when the end was heard
    closed_t: float | None = None  # when its connection closed


@dataclass(frozen=True)
class Fault:
    """What the monitor saw: ``kind`` is "failed", "lost", "silent" or "stalled"; ``lines`` say it for the user."""

    kind: str
    ranks: tuple[int, ...]
    lines: tuple[str, ...] = field(default_factory=tuple)
    code: int = 1  # the launcher's exit code: the failed rank's, else 1


class Monitor:
    """A listening socket and one reader thread per rank connection; ``check()`` is called by the launcher's
    loop, ``ends()`` after the job."""

    def __init__(
        self,
        world_size: int,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S,
        exits_seen: bool = False,
    ) -> None:
        self.world_size = world_size
        # True where the launcher is the ranks' parent and sees their exit codes (the local launcher): a
        # rank's failure and death are then its exit's to report, and the monitor watches for silence only
        self.exits_seen = exits_seen
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._ranks: dict[int, _Rank] = {}
        self._lock = threading.Lock()
        self._open = 0
        self._server = socket.create_server(("0.0.0.0", 0), backlog=max(16, world_size))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._accept, name="ds-launch-monitor", daemon=True).start()

    def endpoints(self) -> str:
        """``addr:port,...`` for every IPv4 address of this host, loopback last: a rank tries them in order."""
        addrs = sorted(ipv4_interfaces(), key=lambda na: na[1].startswith("127."))
        return ",".join(f"{addr}:{self.port}" for _, addr in addrs)

    # --- reading -----------------------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                self._open += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        state: _Rank | None = None
        with conn, conn.makefile("rb") as lines:
            try:
                for raw in lines:
                    hello = state is None
                    state = self._handle(state, json.loads(raw))
                    if hello and state is not None:
                        # the rank's beater ends its rank when it loses this launcher for as long
                        conn.sendall(
                            (json.dumps({"heartbeat_timeout": self.heartbeat_timeout_s}) + "\n").encode()
                        )
            except (OSError, ValueError):
                pass  # a reset connection: the same as a close
        with self._lock:
            self._open -= 1
            if state is not None:
                state.closed_t = time.monotonic()

    def _handle(self, state: _Rank | None, message: dict) -> _Rank | None:
        now = time.monotonic()
        with self._lock:
            if "hello" in message:
                state = _Rank(int(message["hello"]), str(message["host"]), int(message["pid"]), now, now)
                self._ranks[state.rank] = state
            elif state is not None and "beat" in message:
                state.last_beat = now
                state.cpu_s, state.io_bytes = float(message["cpu_s"]), int(message["io_bytes"])
                state.where = str(message.get("where", ""))
                if (
                    state.cpu_s - state.mark[0] >= _PROGRESS_CPU_S
                    or state.io_bytes - state.mark[1] >= _PROGRESS_IO_BYTES
                ):
                    state.mark, state.progress_t = (state.cpu_s, state.io_bytes), now
            elif state is not None and "role" in message:
                state.role = str(message["role"])
            elif state is not None and "end" in message:
                # ordered by when the launcher heard it: ranks' own clocks differ between hosts
                state.end, state.heard_t = {**message["end"], "t_ns": time.monotonic_ns()}, now
                state.role = str(state.end.get("role", state.role))
        return state

    # --- judging -----------------------------------------------------------------------------------
    def check(self, now: float | None = None) -> Fault | None:
        """The first fault seen, or None while the job looks healthy."""
        now = time.monotonic() if now is None else now
        with self._lock:
            ranks = list(self._ranks.values())
        live = [r for r in ranks if r.end is None]
        # a failed rank: mpirun ends the job itself within moments; this is for when it does not
        failed = [r for r in ranks if r.end is not None and r.end.get("code") != 0]
        if failed and not self.exits_seen and now - min(r.heard_t for r in failed) > _LOST_GRACE_S:
            first = min(failed, key=lambda r: r.end["t_ns"])  # type: ignore[index]
            code = int(first.end["code"])  # type: ignore[index]
            return Fault("failed", _ids(failed), (f"rank {first.rank} on {first.host} exited with code {code}",),
                         code if 0 < code < 256 else 1)  # fmt: skip
        # a moment for the runtime (mpirun) to notice the death itself and say how it ended
        lost = [r for r in live if r.closed_t is not None and now - r.closed_t > _LOST_GRACE_S]
        if lost and not self.exits_seen:
            # exit code 137, as for a SIGKILLed rank: the likely end, and what mpirun reports for one
            return Fault("lost", _ids(lost), tuple(
                f"{_who(group)}: the connection to ds-launch closed without a word on how "
                f"{'they' if len(group) > 1 else 'it'} ended: killed (SIGKILL, the OOM killer) or the host went down"
                for group in _by_host(lost)
            ), 128 + 9)  # fmt: skip
        if any(now - r.last_beat > self.heartbeat_timeout_s for r in live):
            # with the first rank past the timeout, every rank that missed beats too (its host's others)
            silent = [r for r in live if now - r.last_beat > _MISSED_BEATS_S]
            return Fault("silent", _ids(silent), tuple(
                f"{_who(group)}: no heartbeat for {now - max(r.last_beat for r in group):.0f} s "
                f"(--heartbeat_timeout {self.heartbeat_timeout_s:g}): the host is unreachable (a network "
                "partition, a host down or frozen) or the processes are stopped"
                for group in _by_host(silent)
            ))  # fmt: skip
        if self.stall_timeout_s > 0 and live and now - max(r.progress_t for r in live) > self.stall_timeout_s:
            idle = now - max(r.progress_t for r in live)
            lines = [
                f"no rank made progress for {idle:.0f} s (--stall_timeout {self.stall_timeout_s:g}; progress is "
                "CPU time of a rank's main thread, or bytes it read or wrote): every rank is blocked. A rank "
                "outside torch.distributed is the likely cause, the others wait for it in a collective:"
            ]
            suspects = sorted(live, key=lambda r: ("distributed" in r.where, r.rank))
            lines += [
                f"  rank {r.rank}{_role(r.role)} on {r.host} (pid {r.pid}): main thread at {r.where or '?'}"
                for r in suspects
            ]
            missing = sorted(set(range(self.world_size)) - {r.rank for r in ranks})
            if missing:
                lines.append(f"  never reached ds-launch's monitor: ranks {', '.join(map(str, missing))}")
            return Fault("stalled", _ids(suspects), tuple(lines))
        return None

    def settle(self, timeout_s: float = 3.0) -> None:
        """Wait until every connection made so far has been read to its end (after the ranks exited)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self._open == 0:
                    return
            time.sleep(0.02)

    def ends(self) -> dict[int, dict]:
        """Every end record heard, by rank (the same fields as the events folder's files, plus ``host``)."""
        with self._lock:
            return {r.rank: dict(r.end) for r in self._ranks.values() if r.end is not None}

    def hosts(self) -> dict[int, str]:
        with self._lock:
            return {r.rank: r.host for r in self._ranks.values()}

    def roles(self) -> dict[int, str]:
        """What each rank said it is in the job (``ds_launch.set_rank_role``), where it said."""
        with self._lock:
            return {r.rank: r.role for r in self._ranks.values() if r.role}

    def unaccounted(self) -> list[str]:
        """Lines naming every rank that did not report ending with code 0 (empty: all did)."""
        ends, hosts = self.ends(), self.hosts()
        lines = []
        never = [rank for rank in range(self.world_size) if rank not in hosts]
        if never:
            lines.append(f"ranks {', '.join(map(str, never))} never reached ds-launch (not started, or started "
                         "without ds-launch's rank entry)")  # fmt: skip
        silent = [r for r in range(self.world_size) if r in hosts and r not in ends]
        by_host: dict[str, list[int]] = {}
        for rank in silent:
            by_host.setdefault(hosts[rank], []).append(rank)
        for host, ranks in by_host.items():
            lines.append(f"{_ranks_on(ranks, host)}: ended without reporting how (killed, or the host lost)")
        failed = [r for r, e in sorted(ends.items()) if e.get("code") != 0]
        for rank in failed:
            after = ", after losing a peer" if ends[rank].get("peer_lost") else ""
            lines.append(
                f"rank {rank} on {hosts.get(rank, '?')}: exited with code {ends[rank].get('code')}{after}"
            )
        return lines

    def close(self) -> None:
        self._server.close()


def _role(role: str) -> str:
    return f" [{role}]" if role else ""


def _ids(ranks: Iterable[_Rank]) -> tuple[int, ...]:
    return tuple(sorted(r.rank for r in ranks))


def _by_host(ranks: Iterable[_Rank]) -> list[list[_Rank]]:
    groups: dict[str, list[_Rank]] = {}
    for r in sorted(ranks, key=lambda r: r.rank):
        groups.setdefault(r.host, []).append(r)
    return list(groups.values())


def _who(group: list[_Rank]) -> str:
    return f"host {group[0].host} ({_ranks_on([r.rank for r in group], None)})"


def _ranks_on(ranks: list[int], host: str | None) -> str:
    named = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
    return named + (f" on {host}" if host else "")

"""A rank's side of ds-launch's monitor: hello, a heartbeat every second, and how the rank ended.

Loaded by ``_rank_entry`` (by path, standard library only: every rank pays for its imports). The launcher
puts ``DS_LAUNCH_MONITOR=addr:port[,addr:port...]`` (each address of the launcher's host) in every rank's
environment; the rank connects to the first that answers, from whatever host it runs on, so the launcher
learns every rank's end without a shared filesystem, and notices a host that goes silent.

The beats come from a small process forked from the rank before the script starts (before torch is
imported), not from a thread: a thread needs the GIL, which an import or a C extension may hold for many
seconds on a loaded machine, and a rank that is only busy must never read as a silent host. The beater
reads the rank's progress from /proc (its main thread's CPU time, the bytes it read and wrote) and hears,
over a pipe, where the rank's main thread is (from a thread of the rank: stale while the GIL is held,
harmless) and how the rank ended. It ends with the rank: when the pipe closes or its parent is gone.

It also ends the rank when it loses the launcher: the connection closed (the launcher ended the job and
exited) or nothing it sent was acknowledged for the launcher's heartbeat timeout (TCP_USER_TIMEOUT: its
host is cut off from the launcher's, which has ended the job by then as a silent host's). A rank the
launcher can no longer reach, nor stop through mpirun or ssh, would otherwise run on for ever, holding its
host's memory and devices: its beater sends it SIGTERM, and SIGKILL after ``END_GRACE_S``, saying why on the
rank's stderr.

One JSON object per line to the launcher: ``{"hello": rank, "host", "pid"}`` once, then ``{"beat": t,
"cpu_s", "io_bytes", "where"}`` every ``BEAT_S`` (and ``{"role": text}`` when the rank says what it is in the
job: ``set_rank_role``), finally ``{"end": record}`` (only when the rank said how
it ended: a rank that vanished without one was killed, or its host lost). One line back, after the hello:
``{"heartbeat_timeout": s}``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time

MONITOR_ENV = "DS_LAUNCH_MONITOR"
# the name this file is loaded under in a rank (by ``_rank_entry``), where ``set_rank_role`` finds it
LIVE_MODULE = "_ds_launch_heartbeat"
BEAT_S = 1.0
_CONNECT_TIMEOUT_S = 10.0
_DEFAULT_LOST_S = 20.0  # the launcher's default --heartbeat_timeout, where it did not say its own
END_GRACE_S = 10.0
END_JOIN_S = 5.0  # how long the rank's end waits for its reporting thread (which wakes at once)
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class Heartbeat:
    """The rank's end of the pipe to its beater process."""

    def __init__(self, write_fd: int) -> None:
        self.role = ""  # what the rank is in the job ("pipeline stage 1"), for the launcher's reports
        self._fd: int | None = write_fd
        self._lock = threading.Lock()
        self._main_ident = threading.get_ident()
        os.register_at_fork(after_in_child=self._forget)  # a forked worker must not keep the beater alive
        self._stop = threading.Event()
        self._where = threading.Thread(target=self._report_where, name="ds-launch-where", daemon=True)
        self._where.start()

    def _forget(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, data)
            except OSError:
                self._forget()  # the beater is gone; the rank goes on as a plain script would

    def _report_where(self) -> None:
        while self._fd is not None and not self._stop.is_set():
            where = self._main_where()
            if where is not None:
                self._send({"where": where})
            self._stop.wait(BEAT_S)

    def _main_where(self) -> str | None:
        """Where the main thread is. Its frame is let go of here, at once: a frame held across the wait
        holds every frame below it and their locals (the script's model, its tensors). When the main thread
        has left them meanwhile, this thread's reference is the last, and they are freed here, later; freeing
        a tensor lets go of the GIL, and a thread that asks for it back once the interpreter is finalizing is
        ended by Python inside torch's C++ code: the process aborts ("terminate called without an active
        exception", exit -6) after the script succeeded (seen in CI; 3 exits in about 270 under disk load)."""
        frame = sys._current_frames().get(self._main_ident)
        if frame is None:
            return None
        return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"

    def describe(self, role: str) -> None:
        """Say what this rank is in the job; the beater passes it on to the launcher at once."""
        self.role = role
        self._send({"role": role})

    def end(self, record: dict) -> None:
        """Say how the rank ends (before the at-exit teardown, which can hang or be killed)."""
        self._send({"end": record})
        with self._lock:
            self._forget()
        self._stop.set()  # and the reporting thread ends now, before the interpreter's finalization
        if self._where is not threading.current_thread():
            self._where.join(END_JOIN_S)


current: Heartbeat | None = None  # this rank's, once started


def set_rank_role(role: str) -> None:
    """Name this rank's part in the job (``"pipeline stage 1"``): ds-launch's reports show it beside the rank.
    Nothing happens in a rank that ds-launch's rank entry did not start."""
    live = sys.modules.get(LIVE_MODULE)
    beat = getattr(live, "current", None)
    if beat is not None:
        beat.describe(str(role))


def start_from_env(rank: int | None) -> Heartbeat | None:
    global current
    endpoints = os.environ.get(MONITOR_ENV)
    if not endpoints or rank is None:
        return None
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    if os.fork() == 0:  # the beater
        os.close(write_fd)
        try:
            _beat(rank, endpoints, parent, read_fd)
        finally:
            os._exit(0)
    os.close(read_fd)
    current = Heartbeat(write_fd)
    return current


def _connect(rank: int, endpoints: str) -> socket.socket | None:
    for endpoint in endpoints.split(","):
        addr, _, port = endpoint.rpartition(":")
        try:
            return socket.create_connection((addr.strip("[]"), int(port)), _CONNECT_TIMEOUT_S)
        except (OSError, ValueError):
            continue
    print(f"ds-launch: rank {rank} on {socket.gethostname()} cannot reach the launcher's monitor at {endpoints}: "
          "the launcher will not see this rank's heartbeat or its end", file=sys.stderr, flush=True)  # fmt: skip
    return None


def _beat(rank: int, endpoints: str, parent: int, pipe: int) -> None:
    """The beater's life: forward the rank's messages, beat every second, end with the rank, and end the
    rank when the launcher is lost."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the rank decides how a signal ends it; the beater follows it
    sock = _connect(rank, endpoints)
    if sock is None:
        return
    # the rank's output pipes are the rank's: a launcher waiting for their end must not wait for the beater
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        sock.sendall(
            (json.dumps({"hello": rank, "host": socket.gethostname(), "pid": parent}) + "\n").encode()
        )
        lost_s = _launcher_timeout(sock)
        sock.settimeout(None)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux: unacknowledged for lost_s, the connection fails
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(lost_s * 1000))
    except OSError as exc:
        sock.close()
        _end_rank(rank, parent, f"the launcher did not answer its hello ({exc})")
        return
    lost = ""
    try:
        lost = _forward(sock, parent, pipe)
    finally:
        sock.close()
    if lost:
        _end_rank(rank, parent, lost)


def _launcher_timeout(sock: socket.socket) -> float:
    """The launcher's heartbeat timeout, from its one line after the hello."""
    sock.settimeout(_CONNECT_TIMEOUT_S)
    line = b""
    while not line.endswith(b"\n"):
        try:
            chunk = sock.recv(256)
        except TimeoutError:
            return _DEFAULT_LOST_S  # a slow launcher is not a lost one
        if not chunk:
            raise OSError("the connection closed")
        line += chunk
    try:
        return max(1.0, float(json.loads(line)["heartbeat_timeout"]))
    except (ValueError, KeyError, TypeError):
        return _DEFAULT_LOST_S


def _forward(sock: socket.socket, parent: int, pipe: int) -> str:
    """Beat and forward until the rank ends (returns "") or the launcher is lost (returns what was seen).

    A rank that has exited may have left its end record in the pipe unread (a short script ends while its
    beater still waits for the launcher's answer to the hello): what the pipe holds is forwarded first."""
    send = sock.sendall
    pending, where, next_beat = b"", "", 0.0
    while True:
        alive = os.getppid() == parent
        try:
            now = time.monotonic()
            if alive and now >= next_beat:
                beat = {
                    "beat": time.time(),
                    "cpu_s": _cpu_s(parent),
                    "io_bytes": _io_bytes(parent),
                    "where": where,
                }
                send((json.dumps(beat) + "\n").encode())
                next_beat = now + BEAT_S
            wait = max(0.0, next_beat - time.monotonic()) if alive else 0.0
            ready, _, _ = select.select([pipe, sock] if alive else [pipe], [], [], wait)
            if sock in ready and not sock.recv(256):
                return "the launcher closed its connection (it ended the job)"
        except OSError as exc:
            return f"the connection to the launcher failed ({exc.strerror or exc}): cut off from its host"
        if pipe not in ready:
            if alive:
                continue
            return ""  # the rank is gone and the pipe holds nothing more: the launcher sees the close
        chunk = os.read(pipe, 1 << 16)
        if not chunk:
            return ""  # the rank exited without saying how: the launcher sees the connection close
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "end" in message or "role" in message:  # passed on as they come
                try:
                    send(line + b"\n")
                except OSError:
                    pass  # the rank is ending anyway, or the next beat finds the launcher lost
                if "end" in message:
                    return ""
            where = message.get("where", where)


def _end_rank(rank: int, parent: int, why: str) -> None:
    """SIGTERM the rank, SIGKILL after END_GRACE_S, saying why on its stderr (this process's is /dev/null)."""
    if os.getppid() != parent:
        return  # the rank is gone already
    text = (f"ds-launch: rank {rank} on {socket.gethostname()} lost the launcher: {why}; ending this rank "
            f"(SIGTERM, SIGKILL after {END_GRACE_S:.0f} s)\n")  # fmt: skip
    try:  # non-blocking: a full pipe whose reader is gone or stuck must not keep the rank alive
        fd = os.open(f"/proc/{parent}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    except OSError:
        pass
    try:
        os.kill(parent, signal.SIGTERM)
        deadline = time.monotonic() + END_GRACE_S
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.1)
        if os.getppid() == parent:
            os.kill(parent, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _cpu_s(pid: int) -> float:
    """CPU time of ``pid``'s main thread (torch's kernels run on it; a blocked collective spends none)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime + stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _io_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/io") as f:
            counts = dict(line.split(": ") for line in f.read().splitlines())
        return int(counts["rchar"]) + int(counts["wchar"])
    except (OSError, KeyError, ValueError):
        return 0

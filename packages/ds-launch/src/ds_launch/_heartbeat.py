"""A rank's side of ds-launch's monitor: hello, a heartbeat every second, and how the rank ended.

Loaded by ``_rank_entry`` (by path, standard library only: every rank pays for its imports). The launcher
puts ``DS_LAUNCH_MONITOR=addr:port[,addr:port...]`` (each address of the launcher's host) in every rank's
environment; the rank connects to the first that answers, from whatever host it runs on, so the launcher
learns every rank's end without a shared filesystem, and notices a host that goes silent.

One JSON object per line: ``{"hello": rank, "host", "pid"}`` once, then ``{"beat": t, "cpu_s", "io_bytes",
"where"}`` every ``BEAT_S``: the main thread's CPU time and the process's bytes read and written (the
launcher's measure of progress: a rank computing or moving data makes some, a rank blocked in a collective
or stuck in a sleep or a lock makes none) and where the main thread is; finally ``{"end": record}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

MONITOR_ENV = "DS_LAUNCH_MONITOR"
BEAT_S = 1.0
_CONNECT_TIMEOUT_S = 10.0
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class Heartbeat:
    """The rank's connection to the launcher; every method is a no-op once the connection is gone."""

    def __init__(self, rank: int, endpoints: str) -> None:
        self.rank = rank
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._sent_bytes = 0
        self._main_tid = threading.get_native_id()
        self._main_ident = threading.get_ident()
        for endpoint in endpoints.split(","):
            addr, _, port = endpoint.rpartition(":")
            try:
                self._sock = socket.create_connection((addr.strip("[]"), int(port)), _CONNECT_TIMEOUT_S)
                break
            except (OSError, ValueError):
                continue
        if self._sock is None:
            print(
                f"ds-launch: rank {rank} on {socket.gethostname()} cannot reach the launcher's monitor at "
                f"{endpoints}: the launcher will not see this rank's heartbeat or its end",
                file=sys.stderr,
                flush=True,
            )
            return
        self._sock.settimeout(None)
        os.register_at_fork(after_in_child=self._forget)  # a forked worker must not hold the connection
        self._send({"hello": rank, "host": socket.gethostname(), "pid": os.getpid()})
        threading.Thread(target=self._beat, name="ds-launch-heartbeat", daemon=True).start()

    def _forget(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        with self._lock:
            if self._sock is None:
                return
            try:
                self._sock.sendall(data)
                self._sent_bytes += len(data)
            except OSError:
                self._sock = None  # the launcher is gone; the rank goes on as a plain script would

    def _beat(self) -> None:
        while self._sock is not None:
            self._send({"beat": time.time(), "cpu_s": self._main_cpu_s(), "io_bytes": self._io_bytes(),
                        "where": self._where()})  # fmt: skip
            time.sleep(BEAT_S)

    def _main_cpu_s(self) -> float:
        try:
            with open(f"/proc/self/task/{self._main_tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime + stime
        except (OSError, IndexError, ValueError):
            return time.process_time()  # no /proc: the whole process's

    def _io_bytes(self) -> int:
        try:
            with open("/proc/self/io") as f:
                counts = dict(line.split(": ") for line in f.read().splitlines())
            return int(counts["rchar"]) + int(counts["wchar"]) - self._sent_bytes
        except (OSError, KeyError, ValueError):
            return 0

    def _where(self) -> str:
        frame = sys._current_frames().get(self._main_ident)
        if frame is None:
            return ""
        return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} in {frame.f_code.co_name}"

    def end(self, record: dict) -> None:
        """Say how the rank ends, then close (before the at-exit teardown, which can hang or be killed)."""
        self._send({"end": record})
        self._forget()


def start_from_env(rank: int | None) -> Heartbeat | None:
    endpoints = os.environ.get(MONITOR_ENV)
    if not endpoints or rank is None:
        return None
    return Heartbeat(rank, endpoints)

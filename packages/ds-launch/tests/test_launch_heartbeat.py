"""A rank's end record reaches the launcher's monitor however soon the rank exits.

The rank hands its record to its beater (a forked helper) through a pipe and exits; the beater may still be
waiting for the launcher's answer to its hello then. Seen under mpirun in CI: a 50-line script's rank 1
"ended without reporting how" and a job whose ranks all exited 0 failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import weakref

from ds_launch._heartbeat import BEAT_S, MONITOR_ENV
from ds_launch._monitor import Monitor

RANK = """
import os
from ds_launch._heartbeat import start_from_env
start_from_env(0).end({"code": 0})
os._exit(0)  # at once: the beater is still connecting
"""


def test_a_rank_that_exits_at_once_still_reports_its_end():
    for attempt in range(8):
        monitor = Monitor(world_size=1)
        try:
            env = {**os.environ, MONITOR_ENV: monitor.endpoints()}
            assert subprocess.run([sys.executable, "-c", RANK], env=env, timeout=60).returncode == 0
            deadline = time.monotonic() + 20  # the beater outlives the rank: wait for its connection
            while 0 not in monitor.hosts() and time.monotonic() < deadline:
                time.sleep(0.02)
            monitor.settle(timeout_s=20)
            assert monitor.unaccounted() == [], f"attempt {attempt}"
        finally:
            monitor.close()


ROLE = """
import os, sys
import ds_launch
from ds_launch import _heartbeat
sys.modules[_heartbeat.LIVE_MODULE] = _heartbeat  # as _rank_entry loads it
beat = _heartbeat.start_from_env(0)
ds_launch.set_rank_role("pipeline stage 1 of 2")
os._exit(0)  # at once, without an end record: the role was passed on as it came
"""


def test_a_rank_s_role_reaches_the_monitor_and_names_it_in_a_stall():
    monitor = Monitor(world_size=1, stall_timeout_s=1.0)
    try:
        env = {**os.environ, MONITOR_ENV: monitor.endpoints()}
        assert subprocess.run([sys.executable, "-c", ROLE], env=env, timeout=60).returncode == 0
        monitor.settle(timeout_s=20)
        deadline = time.monotonic() + 20
        while not monitor.roles() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert monitor.roles() == {0: "pipeline stage 1 of 2"}
    finally:
        monitor.close()
    stalled = Monitor(world_size=1, stall_timeout_s=1.0)  # a stall's lines name it beside the rank
    try:
        t = time.monotonic()
        rank = stalled._handle(None, {"hello": 0, "host": "h", "pid": 7})
        stalled._handle(rank, {"role": "pipeline stage 1 of 2"})
        stalled._handle(rank, {"beat": 0, "cpu_s": 0, "io_bytes": 0, "where": "x.py:3 in forward"})
        fault = stalled.check(now=t + 2)
        assert fault is not None and fault.kind == "stalled"
        assert (
            "  rank 0 [pipeline stage 1 of 2] on h (pid 7): main thread at x.py:3 in forward" in fault.lines
        )
    finally:
        stalled.close()


def _heartbeat_on_a_pipe():
    """A rank's Heartbeat whose pipe is drained by a thread (the beater's side), and the lines read."""
    from ds_launch._heartbeat import Heartbeat

    read_fd, write_fd = os.pipe()
    lines: list[bytes] = []

    def drain():
        with os.fdopen(read_fd, "rb") as pipe:
            lines.extend(pipe)

    threading.Thread(target=drain, daemon=True).start()
    return Heartbeat(write_fd), lines


def test_the_where_report_lets_go_of_the_main_thread_s_frames_at_once():
    """The reporting thread reads where the main thread is and must not keep its frames: what they hold
    (here an object; in a rank, the script's tensors) would be freed by that thread later, at exit while
    the interpreter finalizes, which aborts the process."""
    beat, lines = _heartbeat_on_a_pipe()

    class Held:
        pass

    def work(seconds: float) -> weakref.ref:
        held = Held()
        time.sleep(seconds)  # the reporting thread samples this frame at least once
        return weakref.ref(held)

    try:
        ref = work(1.5 * BEAT_S)
        assert any(b"in work" in line for line in lines), lines
        assert ref() is None, "a frame the main thread has left is still held by the reporting thread"
    finally:
        beat.end({"code": 0})


def test_the_rank_s_end_stops_the_reporting_thread():
    beat, _ = _heartbeat_on_a_pipe()
    t0 = time.monotonic()
    beat.end({"code": 0})
    assert time.monotonic() - t0 < BEAT_S, "the end waited out a whole beat"
    assert not [t for t in threading.enumerate() if t.name == "ds-launch-where"]

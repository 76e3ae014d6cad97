"""Forward each child's stdout and stderr to the launcher's, a whole line at a time.

Every child writes into its own pipe (a pseudo-terminal where the launcher's output is a
terminal); one thread reads them all and writes complete lines, so a
line of one rank is never split by another rank's. Progress bars (``\\r`` frames without a
newline) and prompts are forwarded after ``IDLE_FLUSH_S`` without more data; if another child's
line comes while such a partial line is on screen, it starts on a new line instead of gluing on.
The last stderr lines of each child are kept for the failure report.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import selectors
import sys
import termios
import threading
import time
from dataclasses import dataclass, field

__all__ = ["OutputForwarder", "IDLE_FLUSH_S", "TAIL_LINES"]

IDLE_FLUSH_S = 0.5  # far above the gap between a print's pieces, short enough for a live bar
TAIL_LINES = 20
_READ_BYTES = 1 << 16


@dataclass
class _Stream:
    name: str
    dest_fd: int
    prefix: bytes
    tail: collections.deque[str] | None  # kept for stderr only
    pending: bytearray = field(default_factory=bytearray)
    pending_since: float = 0.0
    at_line_start: bool = True
    partial: str = ""  # the unfinished stderr line, for the tail


class OutputForwarder:
    """Reads the registered pipes in a background thread; ``close()`` drains them."""

    def __init__(self, tag_output: bool = False, stdout_fd: int | None = None, stderr_fd: int | None = None):
        self._tag = tag_output
        self._stdout_fd = sys.stdout.fileno() if stdout_fd is None else stdout_fd
        self._stderr_fd = sys.stderr.fileno() if stderr_fd is None else stderr_fd
        self._selector = selectors.DefaultSelector()
        self._streams: dict[int, _Stream] = {}
        self._stderr_of: dict[str, _Stream] = {}  # also after its pipe closed, for its tail
        self._lock = threading.Lock()
        # Per output file (stdout and stderr are often the same terminal): the stream whose partial
        # line the cursor sits after, if any.
        self._midline: dict[tuple[int, int], _Stream | None] = {}
        self._file_keys = {fd: _file_key(fd) for fd in (self._stdout_fd, self._stderr_fd)}
        self._broken: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ds-launch-output", daemon=True)
        self._launcher = _Stream("ds-launch", self._stderr_fd, b"", None)

    def pipes_for(self, name: str, tail_lines: int = TAIL_LINES) -> tuple[int, int]:
        """A new (stdout, stderr) pair of write ends for child ``name``, keeping its last
        ``tail_lines`` stderr lines; close them after starting the child."""
        ends = []
        for dest_fd, keep_tail in ((self._stdout_fd, False), (self._stderr_fd, True)):
            read_fd, write_fd = _channel_to(dest_fd)
            tail = collections.deque(maxlen=tail_lines) if keep_tail else None
            prefix = f"[{name}] ".encode() if self._tag else b""
            stream = _Stream(name, dest_fd, prefix, tail)
            self._streams[read_fd] = stream
            if keep_tail:
                self._stderr_of[name] = stream
            self._selector.register(read_fd, selectors.EVENT_READ, stream)
            ends.append(write_fd)
        return ends[0], ends[1]

    def start(self) -> None:
        self._thread.start()

    def tail(self, name: str) -> list[str]:
        """The last lines child ``name`` wrote to stderr (its unfinished line last)."""
        with self._lock:
            stream = self._stderr_of.get(name)
            if stream is None or stream.tail is None:
                return []
            partial = [stream.partial] if stream.partial.strip() else []
            return [*stream.tail, *partial][-(stream.tail.maxlen or 0) :]

    def log(self, message: str) -> None:
        """One line of the launcher's own on stderr, never glued to a child's partial line."""
        with self._lock:
            self._emit(self._launcher, f"ds-launch: {message}\n".encode())

    def close(self, timeout_s: float = 5.0) -> None:
        """Forward what is left once the children are gone; a pipe still held open by a straggler
        after ``timeout_s`` is abandoned."""
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            self._stop.set()
            self._thread.join()
        for fd in list(self._streams):
            self._drop(fd)
        self._selector.close()

    # ------------------------------------------------------------------ the reader thread
    def _run(self) -> None:
        while self._streams and not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                try:
                    data = os.read(key.fd, _READ_BYTES)
                except OSError:  # EIO: a pseudo-terminal's last writer is gone (a pipe gives b"")
                    data = b""
                if data:
                    self._feed(key.data, data)
                else:
                    self._drop(key.fd)
            now = time.monotonic()
            for stream in list(self._streams.values()):
                if stream.pending and now - stream.pending_since > IDLE_FLUSH_S:
                    self._flush_pending(stream)

    def _feed(self, stream: _Stream, data: bytes) -> None:
        if not stream.pending:
            stream.pending_since = time.monotonic()
        stream.pending += data
        while True:
            # Whole lines with no \r among them go out in one write: fewer writes, still whole lines.
            last_newline = stream.pending.rfind(b"\n")
            if last_newline != -1 and stream.pending.find(b"\r", 0, last_newline) == -1:
                end: int | None = last_newline + 1
            else:
                end = _segment_end(stream.pending)
            if end is None:
                return
            self._take(stream, end)

    def _take(self, stream: _Stream, end: int) -> None:
        segment = bytes(stream.pending[:end])
        del stream.pending[:end]
        stream.pending_since = time.monotonic()
        if segment:
            with self._lock:
                self._emit(stream, segment)

    def _flush_pending(self, stream: _Stream) -> None:
        self._take(stream, len(stream.pending))

    def _drop(self, fd: int) -> None:
        stream = self._streams.pop(fd, None)
        if stream is None:
            return
        self._flush_pending(stream)
        self._selector.unregister(fd)
        os.close(fd)

    # ------------------------------------------------------------------ writing (under the lock)
    def _emit(self, stream: _Stream, segment: bytes) -> None:
        if stream.tail is not None:
            self._remember(stream, segment)
        out_key = self._file_keys[stream.dest_fd]
        owner = self._midline.get(out_key)
        if owner is not None and owner is not stream:
            self._write(stream.dest_fd, b"\n")  # the other child's partial line stays as it was
            owner.at_line_start = True
        stripped = segment.lstrip(b"\r")
        if stream.prefix and stripped:
            # every line of the segment after its first, and the first if it starts a line
            body = stripped[:-1].replace(b"\n", b"\n" + stream.prefix) + stripped[-1:]
            fresh = stream.at_line_start or len(stripped) < len(segment)
            segment = segment[: len(segment) - len(stripped)] + (stream.prefix if fresh else b"") + body
        self._write(stream.dest_fd, segment)
        stream.at_line_start = segment.endswith(b"\n")
        self._midline[out_key] = None if stream.at_line_start else stream

    def _remember(self, stream: _Stream, segment: bytes) -> None:
        assert stream.tail is not None
        text = segment.decode(errors="replace")
        if text.startswith("\r"):
            stream.partial = ""  # a new frame of a bar replaces the old one
        stream.partial += text.lstrip("\r")
        *lines, stream.partial = stream.partial.split("\n")
        stream.tail.extend(line.rstrip("\r") for line in lines if line.strip())

    def _write(self, fd: int, data: bytes) -> None:
        if fd in self._broken:
            return
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            self._broken.add(fd)  # e.g. `ds-launch ... | head`: keep running, stop writing there


def _file_key(fd: int) -> tuple[int, int]:
    """Which file ``fd`` writes to: stdout and stderr are often the same terminal."""
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    except OSError:
        return -1, fd


def _channel_to(dest_fd: int) -> tuple[int, int]:
    """(read end, write end) for a child's output that goes to ``dest_fd``: a pseudo-terminal when
    that is a terminal, so ranks see one as under torchrun (Python line-buffers, bars and colours
    stay on), else a pipe (as with output redirected to a file)."""
    if not os.isatty(dest_fd):
        return os.pipe()
    master, slave = os.openpty()
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.OPOST  # pass bytes unchanged: the real terminal turns \n into \r\n itself
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    with contextlib.suppress(OSError):  # the same width, for bars that fit themselves to it
        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(dest_fd, termios.TIOCGWINSZ, b"\0" * 8))
    return master, slave


def _segment_end(buf: bytearray) -> int | None:
    """Length of the first complete segment of ``buf``: a line with its newline, or a bar frame
    (text up to the next ``\r`` that is not part of ``\r\n``); None while it is unfinished."""
    newline = buf.find(b"\n")
    limit = len(buf) if newline == -1 else newline
    frame = buf.find(b"\r", 1, limit)
    if frame != -1 and frame + 1 < limit:
        return frame
    if newline != -1:
        return newline + 1  # also when the \r found is the one of \r\n
    return None  # no newline, and at most a trailing \r, which may be half of \r\n

"""What a user sees while a job runs: whole output lines, and the rank that failed first named first.

Real processes throughout: ds-launch's local launcher and its mpi launcher (Open MPI from PyPI).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from collections import Counter

import pytest
from ds_launch._output import IDLE_FLUSH_S, OutputForwarder
from launch_procs import DS_LAUNCH, SCRIPTS, mpi_env, run_cli

LINES_PER_RANK = 2000
MPI_ARGS = ["--launcher", "mpi", "--launcher_args", "--oversubscribe"]


def _launchers():
    mpi = pytest.param(
        MPI_ARGS,
        id="mpi",
        marks=[pytest.mark.mpi, pytest.mark.skipif(_no_mpi4py(), reason="needs ds-launch[mpi]")],
    )
    return [pytest.param([], id="local"), mpi]


def _no_mpi4py() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return True
    return False


def _env(**extra: str) -> dict[str, str]:
    env = mpi_env()
    env.update(extra)
    return env


@pytest.mark.parametrize("launcher", _launchers())
def test_four_ranks_printing_concurrently_every_line_arrives_whole(launcher):
    # PYTHONUNBUFFERED makes a plain Python write print's text and newline in two calls; ds-launch
    # exports PYTHON* to the ranks, so it must not let that split lines.
    res = run_cli(
        [*launcher, "--num_procs", "4", str(SCRIPTS / "chatty_rank.py"), str(LINES_PER_RANK)],
        timeout_s=180,
        env=_env(PYTHONUNBUFFERED="1"),
    )
    assert res.returncode == 0, res.stderr[-3000:]
    seen: dict[int, list[int]] = {r: [] for r in range(4)}
    for line in res.stdout.splitlines():
        record = json.loads(line)  # a glued or split line does not parse
        assert record["pad"] == "x" * (record["i"] % 97)
        seen[record["rank"]].append(record["i"])
    assert all(seen[r] == list(range(LINES_PER_RANK)) for r in range(4))
    err = [json.loads(ln) for ln in res.stderr.splitlines() if not ln.startswith("ds-launch: running ")]
    assert Counter(r["rank"] for r in err) == {r: LINES_PER_RANK // 10 for r in range(4)}


def test_ranks_write_line_buffered_even_with_pythonunbuffered(tmp_path):
    script = tmp_path / "buffering.py"
    script.write_text(
        "import json, sys\n"
        "print(json.dumps([s.line_buffering and not s.write_through for s in (sys.stdout, sys.stderr)]))\n"
    )
    res = run_cli(["--num_procs", "1", "--no_local_rank", str(script)], env=_env(PYTHONUNBUFFERED="1"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [True, True]


@pytest.mark.parametrize("launcher", _launchers())
def test_tag_output_prefixes_every_line_with_its_rank(launcher):
    args = [*launcher, "--num_procs", "2", "--tag_output", str(SCRIPTS / "chatty_rank.py"), "50"]
    res = run_cli(args, timeout_s=120, env=_env())
    assert res.returncode == 0, res.stderr
    # ds-launch's own tag, or mpirun's --tag-output ("[jobid,rank]<stdout>: ")
    tag = re.compile(r"\[rank (\d+)\] (.*)" if not launcher else r"\[\d+,(\d+)\]<stdout>: ?(.*)")
    lines = res.stdout.splitlines()
    for line in lines:
        rank, text = tag.fullmatch(line).groups()
        assert json.loads(text)["rank"] == int(rank)
    assert len(lines) == 100


def test_script_runs_as_under_plain_python(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(
        "import json, pickle, sys\n"
        "class Point:\n    pass\n"
        "pickle.loads(pickle.dumps(Point()))  # classes of __main__ pickle (spawned workers, torch.save)\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv, 'path0': sys.path[0], 'file': __file__}))\n"
    )
    res = run_cli(["--num_procs", "1", "--no_local_rank", str(script), "a b"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {
        "name": "__main__",
        "argv": [str(script), "a b"],
        "path0": str(tmp_path),
        "file": str(script),
    }


def test_uncaught_exception_traceback_shows_only_the_users_frames(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\nf()\n")
    res = run_cli(["--num_procs", "1", "--no_local_rank", str(script)])
    assert res.returncode == 1
    traceback = res.stderr.split("ds-launch:")[0]
    assert "runpy" not in traceback and "_rank_entry" not in traceback
    assert f'File "{script}", line 4' in traceback and "ValueError: boom" in traceback


@pytest.mark.parametrize("launcher", _launchers())
@pytest.mark.parametrize(
    ("how", "expected_code", "expected"),
    [("exit", 3, "rank 2 exited with code 3"), ("kill", 128 + 9, "rank 2 ")],
)
def test_report_names_the_rank_that_failed_first(launcher, how, expected_code, expected):
    # Rank 2 leaves after the first all-reduce; ranks 0, 1, 3 then fail in their next one and exit 1
    # at once, while rank 2 may still be in init_distributed's at-exit teardown (or, when SIGKILLed,
    # be reaped in the same poll as its peers).
    res = run_cli(
        [*launcher, "--num_procs", "4", "--grace", "2", str(SCRIPTS / "fail_after_collective.py"), "2", how],
        timeout_s=180,
        env=_env(),
    )
    assert res.returncode == expected_code, res.stderr[-3000:]
    ours = [ln for ln in res.stderr.splitlines() if re.match(r"ds-launch: rank \d", ln)]
    assert ours and ours[0].startswith(f"ds-launch: {expected}"), res.stderr[-3000:]
    assert ours[0].endswith("the first rank to fail."), ours
    if how == "kill" and not launcher:
        assert "was killed by signal SIGKILL (9)" in ours[0]
    if not launcher:  # the local launcher reads each rank's stderr apart from the others
        at = res.stderr.index("The last lines rank 2 wrote to stderr:")
        assert f"rank 2 fails now ({how})" in res.stderr[at:]


# ---------------------------------------------------------------- the forwarder on its own


def _forward(writes: list[tuple[str, bytes, float]], tag: bool = False) -> tuple[bytes, OutputForwarder]:
    """Feed ``(child, bytes, pause_s)`` writes through pipes into a forwarder writing to a pipe."""
    out_r, out_w = os.pipe()
    fwd = OutputForwarder(tag, stdout_fd=out_w, stderr_fd=out_w)
    ends = {name: fwd.pipes_for(name) for name in dict.fromkeys(n for n, _, _ in writes)}
    fwd.start()
    collected = bytearray()
    reader = threading.Thread(target=lambda: _read_all(out_r, collected))
    reader.start()
    for name, data, pause_s in writes:
        os.write(ends[name][1], data)  # stderr: its tail is kept too
        time.sleep(pause_s)
    for out_end, err_end in ends.values():
        os.close(out_end)
        os.close(err_end)
    fwd.close()
    os.close(out_w)
    reader.join()
    os.close(out_r)
    return bytes(collected), fwd


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 65536):
        into += chunk


def test_a_line_written_in_pieces_is_forwarded_whole():
    out, _ = _forward([("a", b'{"rank": 2', 0.05), ("b", b'{"rank": 0}\n', 0.05), ("a", b"}\n", 0)])
    assert out == b'{"rank": 0}\n{"rank": 2}\n'


def test_a_partial_line_is_shown_after_a_pause_and_never_glued_to_another_line():
    bar = [("a", b"\r 10%|#", 0.05), ("a", b"\r 20%|##", IDLE_FLUSH_S + 0.4)]
    out, fwd = _forward([*bar, ("b", b"log line\n", 0.05), ("a", b"\r 30%|###\n", 0)], tag=True)
    assert out == b"\r[a]  10%|#\r[a]  20%|##\n[b] log line\n\r[a]  30%|###\n"
    assert fwd.tail("a") == [" 30%|###"]
    assert fwd.tail("b") == ["log line"]


def test_lines_read_together_are_each_tagged():
    out, fwd = _forward([("a", b"one\ntwo\nthr", 0.05), ("a", b"ee\n", 0)], tag=True)
    assert out == b"[a] one\n[a] two\n[a] three\n"
    assert fwd.tail("a") == ["one", "two", "three"]


def test_the_launchers_own_lines_start_on_a_line_of_their_own():
    out_r, out_w = os.pipe()
    fwd = OutputForwarder(stdout_fd=out_w, stderr_fd=out_w)
    _, err = fwd.pipes_for("rank 0")
    fwd.start()
    os.write(err, b"Enter a number: ")
    time.sleep(IDLE_FLUSH_S + 0.4)
    fwd.log("stopping")
    os.close(err)
    os.close(_)
    fwd.close()
    os.close(out_w)
    assert os.read(out_r, 4096) == b"Enter a number: \nds-launch: stopping\n"
    os.close(out_r)


def test_last_stderr_lines_are_kept_per_rank():
    writes = [("r0", f"line {i}\n".encode(), 0) for i in range(30)] + [("r1", b"other\n", 0)]
    _, fwd = _forward(writes)
    assert fwd.tail("r0") == [f"line {i}" for i in range(10, 30)]


def test_mpi_command_line_runs_ranks_through_the_line_buffered_entry():
    from ds_launch.cli import build_parser, program_argv

    args = build_parser().parse_args(["--module", "pkg.train", "x"])
    python, entry, *rest = program_argv(args)
    assert (python, entry.rsplit("/", 1)[1], rest) == (sys.executable, "_rank_entry.py", ["-m", "pkg.train"])


def test_ranks_see_a_terminal_when_the_launchers_output_is_one(tmp_path):
    script = tmp_path / "tty.py"
    script.write_text(
        "import os, sys\nprint(sys.stdout.isatty(), sys.stderr.isatty(), os.get_terminal_size().columns)\n"
    )
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 123, 0, 0))
    proc = subprocess.Popen(
        [*DS_LAUNCH, "--num_procs", "1", "--no_local_rank", str(script)],
        stdout=slave,
        stderr=subprocess.DEVNULL,
    )
    os.close(slave)
    data = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO once the last writer is gone
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert data.decode().split() == ["True", "False", "123"]  # stderr stayed a pipe here: a pipe there


def test_module_mode_runs_as_python_dash_m(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        "import json, sys\nprint(json.dumps({'name': __name__, 'argv': sys.argv[1:], 'path0': sys.path[0]}))\n"
    )
    res = subprocess.run(
        [*DS_LAUNCH, "--num_procs", "1", "--no_local_rank", "--module", "pkg.train", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"name": "__main__", "argv": ["x"], "path0": str(tmp_path)}

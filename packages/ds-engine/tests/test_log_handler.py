"""The engine's steps_per_print lines and a tqdm bar share a terminal: the lines go above the bar.

A real job: ``ds-launch`` on a pseudo-terminal, one rank training with a tqdm bar; what the terminal
would show is rebuilt from the bytes (carriage returns overwrite, newlines open a row).
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import textwrap

RANK_SCRIPT = textwrap.dedent(
    """
    import torch
    import ds_engine
    from tqdm import tqdm

    cfg = {"train_batch_size": 2, "steps_per_print": 5, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    engine, *_ = ds_engine.initialize(model=torch.nn.Linear(2, 1), config=cfg)
    bar = tqdm(total=20, mininterval=0, unit="step")
    for _ in range(20):
        loss = engine(torch.ones(2, 2)).sum()
        engine.backward(loss)
        engine.step()
        bar.update(1)
    bar.close()
    """
)
_CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _screen(data: bytes) -> list[str]:
    """The rows a terminal shows after ``data`` (cursor movement other than \\r and \\n ignored)."""
    rows: list[list[str]] = [[]]
    col = 0
    for ch in _CSI.sub(b"", data).decode(errors="replace"):
        if ch == "\r":
            col = 0
        elif ch == "\n":
            rows.append([])
            col = 0
        else:
            row = rows[-1]
            row.extend(" " * (col + 1 - len(row)))
            row[col] = ch
            col += 1
    return ["".join(r).rstrip() for r in rows]


def test_steps_per_print_lines_land_above_the_progress_bar(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # 40 rows, 100 columns
    proc = subprocess.Popen(
        [sys.executable, "-m", "ds_launch.cli", "--num_procs", "1", "--no_local_rank", str(script)],
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    data = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the launcher, the last writer, is gone
            break
        if not chunk:
            break
        data += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, bytes(data).decode(errors="replace")
    rows = _screen(bytes(data))
    logged = [r for r in rows if "step=" in r]
    assert [re.search(r"step=(\d+)", r).group(1) for r in logged] == ["5", "10", "15", "20"], rows
    assert all(r.startswith("[ds ") and "%|" not in r for r in logged), rows
    bars = [r for r in rows if "%|" in r]
    assert bars and "20/20" in bars[-1] and rows.index(bars[-1]) > rows.index(logged[-1]), rows

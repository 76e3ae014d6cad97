"""The ``deepspeed`` command and ``deepspeed.launcher.launch`` running real (torch-free) ranks on this machine:
``--no_ssh --node_rank`` (one host's share), ``--force_multi`` (the multi-host launcher for one host, over a
remote shell with ssh's calling convention given in ``$DS_LAUNCH_SSH``), ``launch --world_info``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

RANK = """
import json, os, sys
out = [a for a in sys.argv[1:] if not a.startswith("--local_rank")][0]
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "MASTER_ADDR", "MASTER_PORT")
with open(os.path.join(out, f"r{os.environ['RANK']}.json"), "w") as f:
    json.dump({**{k: os.environ.get(k) for k in keys}, "argv": sys.argv[1:]}, f)
"""


def _run(module: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120, env=full
    )


def _seen(out: Path) -> dict[int, dict]:
    return {int(p.stem[1:]): json.loads(p.read_text()) for p in out.glob("r*.json")}


def test_no_ssh_runs_this_hosts_share(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "hostfile").write_text("a slots=2\nb slots=2\n")
    args = ["-H", str(tmp_path / "hostfile"), "--no_ssh", "--node_rank", "1", "--master_addr", "127.0.0.1",
            "--master_port", "29541", str(tmp_path / "rank.py"), str(tmp_path)]  # fmt: skip
    proc = _run("deepspeed.launcher.runner", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = _seen(tmp_path)
    assert sorted(seen) == [2, 3]  # host b's ranks only
    assert [(seen[r]["LOCAL_RANK"], seen[r]["WORLD_SIZE"], seen[r]["CROSS_RANK"]) for r in (2, 3)] == [
        ("0", "4", "1"),
        ("1", "4", "1"),
    ]


def test_force_multi_uses_the_remote_shell_for_one_host(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "hostfile").write_text("onlyhost slots=2\n")
    rsh = tmp_path / "rsh"
    rsh.write_text(f'#!/bin/sh\necho "$1" > {tmp_path}/entered\nexec /bin/sh -c "$2"\n')
    rsh.chmod(0o755)
    args = ["-H", str(tmp_path / "hostfile"), "--force_multi", "--launcher", "pdsh", "--master_addr", "127.0.0.1",
            "--master_port", "29542", str(tmp_path / "rank.py"), str(tmp_path)]  # fmt: skip
    proc = _run("deepspeed.launcher.runner", args, {"DS_LAUNCH_SSH": str(rsh), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "entered").read_text().split() == ["onlyhost"]
    assert sorted(_seen(tmp_path)) == [0, 1]
    assert _seen(tmp_path)[1]["argv"] == ["--local_rank=1", str(tmp_path)]


def test_launch_module_runs_a_node(tmp_path):
    (tmp_path / "rank.py").write_text(RANK)
    world = base64.urlsafe_b64encode(json.dumps({"a": [0], "b": [0, 1]}).encode()).decode()
    args = [f"--world_info={world}", "--node_rank=1", "--master_addr=10.1.2.3", "--master_port=29543",
            "--no_local_rank", str(tmp_path / "rank.py"), str(tmp_path)]  # fmt: skip
    proc = _run("deepspeed.launcher.launch", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = _seen(tmp_path)
    assert sorted(seen) == [1, 2]
    assert (seen[2]["LOCAL_RANK"], seen[2]["LOCAL_SIZE"], seen[2]["MASTER_ADDR"]) == ("1", "2", "10.1.2.3")
    assert seen[2]["argv"] == [str(tmp_path)]

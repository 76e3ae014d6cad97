"""The ssh launcher's mechanics on this machine: node launchers, the command line a remote shell gets,
global ranks, and stopping. The remote shell here is a local one with ssh's calling convention
(``rsh HOST COMMAND``: run COMMAND through ``sh -c``), so these run wherever the package's tests do; the
same launcher across real (namespace) hosts is integration/test_launch_ssh.py.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from ds_launch import decode_world_info, encode_world_info
from ds_launch._ssh import node_launcher_argv, pdsh_command, remote_command
from launch_procs import SCRIPTS, records, run_cli, wait_no_survivors

ENV_RANK = str(SCRIPTS / "env_rank.py")


@pytest.fixture
def rsh(tmp_path) -> str:
    """``rsh HOST COMMAND``: what ssh does with COMMAND on HOST, done on this machine (and HOST logged)."""
    script = tmp_path / "rsh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {tmp_path}/hosts_entered\nexec /bin/sh -c "$2"\n')
    script.chmod(0o755)
    return str(script)


def test_world_info_is_deepspeeds_encoding():
    text = encode_world_info({"a": [0, 1], "b": [2]})
    assert json.loads(base64.urlsafe_b64decode(text)) == {"a": [0, 1], "b": [2]}
    assert decode_world_info(text) == {"a": [0, 1], "b": [2]}


def test_remote_command_keeps_arguments_whole():
    argv = node_launcher_argv(
        "W", "--node_rank=1", "10.0.0.1", 29500, ["--tag_output"], ["s.py", "a b", "$(x)"]
    )
    line = remote_command(argv, {"PYTHONPATH": "/w d", "K": "v;1"}, Path("/work dir"), "/env/activate")
    assert line.startswith(". /env/activate && cd '/work dir' && exec env ")
    words = shlex.split(line.split(" && exec ", 1)[1])  # what the remote /bin/sh -c gives exec
    assert words[:3] == ["env", "PYTHONPATH=/w d", "K=v;1"]
    assert words[3:] == argv
    assert argv[-3:] == ["s.py", "a b", "$(x)"] and "--world_info=W" in argv and "--node_rank=1" in argv


def test_pdsh_command_runs_the_remote_shell_per_host():
    cmd = pdsh_command(["ssh", "-p", "2222"], ["a", "b"], "CMD --node_host=%h", ["-u", "30"])
    assert cmd == ["pdsh", "-S", "-f", "1024", "-R", "exec", "-w", "a,b", "-u", "30", "ssh", "-p", "2222", "%h",
                   "CMD --node_host=%h"]  # fmt: skip


def test_two_hosts_over_a_remote_shell(tmp_path, rsh):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=1\n")
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli(["-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", rsh, "--master_addr", "127.0.0.1",
                   "--master_port", "29533", ENV_RANK, "--out", str(out), "one arg"])  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted((tmp_path / "hosts_entered").read_text().split()) == ["hostA", "hostB"]
    recs = records(out)
    got = [
        (recs[r]["RANK"], recs[r]["LOCAL_RANK"], recs[r]["WORLD_SIZE"], recs[r]["LOCAL_WORLD_SIZE"])
        for r in range(3)
    ]
    assert got == [("0", "0", "3", "2"), ("1", "1", "3", "2"), ("2", "0", "3", "1")]
    for rec in recs.values():
        assert rec["argv"] == [f"--local_rank={rec['LOCAL_RANK']}", "--out", str(out), "one arg"]
        assert (rec["MASTER_ADDR"], rec["MASTER_PORT"]) == ("127.0.0.1", "29533")


def test_a_failing_host_stops_the_others_and_is_named(tmp_path, rsh):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("hostA slots=2\nhostB slots=2\n")
    marker = f"marker-{os.getpid()}-ssh"
    res = run_cli(["-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", rsh, "--master_addr", "127.0.0.1",
                   "--master_port", "29534", "--grace", "1", ENV_RANK, "--out", str(tmp_path), "--fail-rank", "2",
                   "--sleep", "60", marker], timeout_s=60)  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert "ds-launch: host hostB (ranks 2-3) exited with code 3: the first host to fail." in res.stderr
    assert "ds-launch:   | ds-launch: rank 2 exited with code 3: the first rank to fail." in res.stderr
    assert "Stopped by ds-launch because of it: host hostA (ranks 0-1)" in res.stderr
    assert wait_no_survivors(marker) == []


def test_node_launcher_stops_its_ranks_when_its_parent_goes(tmp_path):
    """What a lost ssh connection does to a host: the node launcher's parent (sshd's session) goes."""
    marker = f"marker-{os.getpid()}-orphan"
    world = encode_world_info({"hostA": [0, 1]})
    node = shlex.join([sys.executable, "-m", "ds_launch.cli", f"--world_info={world}", "--node_rank=0",
                       "--master_addr", "127.0.0.1", "--master_port", "29535", ENV_RANK, "--out", str(tmp_path),
                       "--sleep", "60", marker])  # fmt: skip
    # a parent shell that starts the node launcher, waits until both ranks run, and exits
    wait = f"while [ ! -e {tmp_path}/rank1.json ] || [ ! -e {tmp_path}/rank0.json ]; do sleep 0.1; done"
    parent = subprocess.run(["/bin/sh", "-c", f"{node} > /dev/null 2>&1 & {wait}"], timeout=60)
    assert parent.returncode == 0 and sorted(records(tmp_path)) == [0, 1]
    assert wait_no_survivors(marker, within_s=15) == []


def test_terminate_process_tree_ends_children_and_grandchildren():
    import subprocess
    import time
    from pathlib import Path

    from ds_launch import terminate_process_tree

    # a shell whose child shell has a child of its own: three generations, none of which exits by itself
    root = subprocess.Popen(["sh", "-c", "sh -c 'sleep 300 & wait' & sleep 300 & wait"])
    deadline = time.monotonic() + 20
    from ds_launch._supervise import _alive, _descendants

    while len(_descendants(root.pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = [*_descendants(root.pid), root.pid]
    assert len(tree) >= 4, tree
    terminate_process_tree(root.pid, grace_s=5)
    root.wait(timeout=10)
    assert not any(_alive(p) for p in tree), [p for p in tree if Path(f"/proc/{p}").exists()]

"""ds-launch's ssh and pdsh launchers and the ``deepspeed`` command across two test hosts (testing/hosts).

The hosts are network namespaces with their own hostname, /dev/shm and address; the remote shell is the
harness's ssh-like agent (``cluster.ssh``: it enters a host as ssh enters a machine, with a fresh login
environment), given to ds-launch as ``--ssh_cmd`` or found first on PATH under the name ``ssh`` (as the
``deepspeed`` command and pdsh find ssh). Jobs start on node0, as a user starts them from the first node.

- 2 hosts x 2 ranks at ZeRO 2 under ``ds-launch --launcher ssh`` give the losses of 1 host x 4 ranks (run by
  ``deepspeed --num_gpus 4``: on CPU, processes per host).
- ``deepspeed --hostfile`` (pdsh where installed, else ssh) puts each rank where DeepSpeed would, with its
  environment, rank 0's address and ``--local_rank``.
- A rank failing on the second host ends the job non-zero, the report naming that host and rank, and no
  rank is left on either host; likewise a host the remote shell cannot reach, and under pdsh. Once more
  over real ssh: OpenSSH's sshd running inside each host (where openssh-server is installed), so the
  ranks on the healthy host must stop because their ssh session ended.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hosts import cluster_fixture

from conftest import HERE, world_size

pytestmark = pytest.mark.skipif(
    world_size() != 2, reason="multi-host launches run in the 2-rank session only"
)

cluster = cluster_fixture(2)
ENV_RANK = HERE.parent / "packages" / "ds-launch" / "tests" / "scripts" / "env_rank.py"
PARITY = HERE / "scripts" / "engine_parity.py"
WHERE_RANK = HERE / "scripts" / "where_rank.py"
FAIL_WHEN_ALL_STARTED = HERE / "scripts" / "fail_when_all_started.py"
CONFIG = "stage2-fp32-gas1"
STEPS = "4"


def _login_path(cluster) -> str:
    """The agent (named ssh) first, then this Python's bin: how pdsh and the deepspeed command find ssh."""
    return f"{cluster.ssh.parent}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def _on_node0(cluster, argv: list[str], cwd: Path, timeout_s: float = 300) -> subprocess.CompletedProcess:
    env = {"PATH": _login_path(cluster), "OMP_NUM_THREADS": "1"}
    # entering a host's mount namespace starts in its root folder: `cwd=` would not carry over
    return cluster.run("node0", ["env", "-C", str(cwd), *argv], env=env, timeout=timeout_s)


def _tool(name: str) -> list[str]:
    """A console script of this environment, or its module where the package is not installed."""
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    module = {"ds-launch": "ds_launch.cli", "deepspeed": "deepspeed.launcher.runner"}[name]
    return [found] if found else [sys.executable, "-m", module]


def _losses(path: Path) -> list[float]:
    return json.loads(path.read_text())["losses"][CONFIG]


@pytest.fixture(scope="module")
def one_host_losses(tmp_path_factory) -> list[float]:
    """1 host x 4 ranks through the ``deepspeed`` command's local path (``--num_gpus``: ranks per host on CPU)."""
    out = tmp_path_factory.mktemp("one-host") / "losses.json"
    cmd = [*_tool("deepspeed"), "--num_gpus", "4", str(PARITY), str(out), "--only", CONFIG, "--steps", STEPS]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return _losses(out)


def test_ssh_launcher_two_hosts_equal_one_host(cluster, tmp_path, one_host_losses):
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=2)
    out = tmp_path / "losses.json"
    cmd = [*_tool("ds-launch"), "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", str(cluster.ssh),
           "--export", "OMP_NUM_THREADS=1", "--tag_output",
           str(PARITY), str(out), "--only", CONFIG, "--steps", STEPS]  # fmt: skip
    proc = _on_node0(cluster, cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    # the rendezvous address is node0's on the hosts' link (hostname -I through the remote shell)
    assert f"rendezvous at {cluster.address('node0')}:29500" in proc.stderr
    assert _losses(out) == pytest.approx(one_host_losses, rel=1e-5)


def test_deepspeed_command_across_hosts(cluster, tmp_path):
    """``deepspeed --hostfile`` with DeepSpeed's defaults: pdsh (else ssh) found on PATH, rank 0's address
    from ``hostname -I`` on the first host, ``.deepspeed_env`` exported, ``--local_rank`` passed."""
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=2)
    (tmp_path / ".deepspeed_env").write_text("OMP_NUM_THREADS=3\n")  # DeepSpeed's way to export a variable
    cmd = [*_tool("deepspeed"), "--hostfile", str(hostfile), str(WHERE_RANK), str(tmp_path)]
    proc = _on_node0(cluster, cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    via = " through pdsh" if shutil.which("pdsh") else ""
    assert f"4 ranks on 2 host(s) over 'ssh -o BatchMode=yes'{via}" in proc.stderr
    seen = [json.loads((tmp_path / f"where{r}.json").read_text()) for r in range(4)]
    assert [(s["host"], s["RANK"], s["LOCAL_RANK"], s["CROSS_RANK"]) for s in seen] == [
        ("node0", "0", "0", "0"), ("node0", "1", "1", "0"), ("node1", "2", "0", "1"), ("node1", "3", "1", "1")
    ]  # fmt: skip
    for s in seen:
        assert (s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["LOCAL_SIZE"], s["CROSS_SIZE"]) == (
            "4",
            "2",
            "2",
            "2",
        )
        assert (s["MASTER_ADDR"], s["MASTER_PORT"]) == (cluster.address("node0"), "29500")  # DeepSpeed's port
        assert s["OMP_NUM_THREADS"] == "3"
        assert s["argv"] == [f"--local_rank={s['LOCAL_RANK']}", str(tmp_path)]


def _assert_nothing_left(cluster, marker: str, within_s: float = 15.0) -> None:
    """No process of the job on any host, once a stopped host's launcher has had its grace period."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_left(cluster, n, marker) for n in cluster.names):
        time.sleep(0.2)
    for name in cluster.names:
        left = _left(cluster, name, marker)
        assert not left, f"ranks left running on {name}: {left}"


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_failing_remote_rank_fails_the_job_naming_its_host(cluster, tmp_path, launcher):
    if launcher == "pdsh" and shutil.which("pdsh") is None:
        pytest.skip("pdsh is not installed (apt install pdsh)")
    marker = uuid.uuid4().hex
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=2)
    # ranks 0-2 would run for 60 s; rank 3, on node1, exits 3
    sleep = "60"
    cmd = [*_tool("ds-launch"), "-H", str(hostfile), "--launcher", launcher, "--ssh_cmd", str(cluster.ssh),
           str(ENV_RANK), "--out", str(tmp_path), "--fail-rank", "3", "--sleep", sleep, marker]  # fmt: skip
    proc = _on_node0(cluster, cmd, tmp_path, timeout_s=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "rank 3 exited with code 3: the first rank to fail." in proc.stderr
    if launcher == "ssh":
        assert "ds-launch: host node1 (ranks 2-3) exited with code 3: the first host to fail." in proc.stderr
        assert "Stopped by ds-launch because of it: host node0 (ranks 0-1)" in proc.stderr
    else:
        # pdsh would wait for node0's ranks; ds-launch's monitor heard rank 3 fail and ended the job
        assert "ds-launch: rank 3 on node1 exited with code 3: the first rank to fail." in proc.stderr
    # the ranks that started before the job was stopped ran where the hostfile put them (rank 3 did)
    ranks = {r: json.loads(p.read_text()) for r in range(4) if (p := tmp_path / f"rank{r}.json").exists()}
    assert 3 in ranks
    assert all(
        (v["RANK"], v["LOCAL_RANK"], v["WORLD_SIZE"]) == (str(r), str(r % 2), "4") for r, v in ranks.items()
    )
    _assert_nothing_left(cluster, marker)


def test_unreachable_host_fails_the_job_naming_it(cluster, tmp_path):
    marker = uuid.uuid4().hex
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode9 slots=1\n")  # node9: no such host
    cmd = [*_tool("ds-launch"), "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", str(cluster.ssh),
           "--master_addr", cluster.address("node0"), "--master_port", "29532",
           str(ENV_RANK), "--out", str(tmp_path), "--sleep", "60", marker]  # fmt: skip
    proc = _on_node0(cluster, cmd, tmp_path, timeout_s=120)
    assert proc.returncode == 255, proc.stderr[-3000:]
    assert "ds-launch: host node9 (rank 1) exited with code 255: the first host to fail." in proc.stderr
    assert "Could not resolve hostname node9" in proc.stderr
    assert "Stopped by ds-launch because of it: host node0 (rank 0)" in proc.stderr
    _assert_nothing_left(cluster, marker)


@pytest.fixture(scope="module")
def sshd(cluster, tmp_path_factory) -> list[str]:
    """OpenSSH's sshd on port 22 of every host, root by key only; yields the client command for ds-launch."""
    if shutil.which("sshd", path="/usr/sbin:/usr/bin") is None:
        pytest.skip(
            "openssh-server is not installed (apt install openssh-server): the real-ssh case needs sshd"
        )
    keys = tmp_path_factory.mktemp("ssh")
    for name in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "userkey.pub").read_text())
    config = keys / "sshd_config"
    config.write_text(
        f"Port 22\nHostKey {keys}/hostkey\nPidFile none\nAuthorizedKeysFile {keys}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPrintMotd no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation folder
    daemons = [cluster.popen(n, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.DEVNULL)
               for n in cluster.names]  # fmt: skip
    client = ["/usr/bin/ssh", "-i", str(keys / "userkey"), "-o", "StrictHostKeyChecking=no",
              "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip
    for _ in range(50):  # until both listen
        if all(cluster.run("node0", [*client, n, "true"]).returncode == 0 for n in cluster.names):
            break
        time.sleep(0.2)
    yield client
    for daemon in daemons:
        daemon.terminate()
        daemon.wait(timeout=10)


def test_real_ssh_failing_rank_stops_the_other_host(cluster, sshd, tmp_path):
    marker = uuid.uuid4().hex
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=2)
    cmd = [*_tool("ds-launch"), "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", shlex.join(sshd),
           "--master_port", "29536", str(FAIL_WHEN_ALL_STARTED), str(tmp_path), marker]  # fmt: skip
    proc = _on_node0(cluster, cmd, tmp_path, timeout_s=120)
    assert proc.returncode == 3, proc.stderr[-3000:]
    # rank 0's address came from `ssh node0 hostname -I`, over real ssh
    assert f"rendezvous at {cluster.address('node0')}:29536" in proc.stderr
    assert "ds-launch: host node1 (ranks 2-3) exited with code 3: the first host to fail." in proc.stderr
    assert "Stopped by ds-launch because of it: host node0 (ranks 0-1)" in proc.stderr
    assert sorted(p.name for p in tmp_path.glob("started*")) == [f"started{r}" for r in range(4)]
    # node0's ranks ran under sshd's session, not under ds-launch: they ended because that session did
    _assert_nothing_left(cluster, marker)


def _left(cluster, name: str, marker: str) -> list[int]:
    found = []
    for pid in cluster.pids(name):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found

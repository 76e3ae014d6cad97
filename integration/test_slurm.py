"""Jobs under a real Slurm across two test hosts (testing/hosts): ``slurmctld`` on node0, a ``slurmd`` on each.

Debian's slurm-wlm and munge (.ci/run installs them); the harness starts a private munged and the daemons
inside the namespace hosts. Jobs start on node0, as a user starts them from a login node.

- ``ds-launch --launcher slurm`` runs ``srun`` over the hostfile's hosts: every rank finds its place from
  Slurm's variables and all-reduces across the hosts.
- A script started by ``srun`` itself (no launcher) finds its rank, its local rank and rank 0's address
  (the step's first host) from Slurm's variables alone.
- ``deepspeed --launcher slurm`` runs the same through ds-launch.
- A node lost under Slurm (every process on node1 killed, slurmd included) ends the job non-zero, the report
  naming node1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hosts import cluster_fixture

from conftest import HERE, world_size

pytestmark = pytest.mark.skipif(
    world_size() != 2, reason="multi-host launches run in the 2-rank session only"
)

cluster = cluster_fixture(2)
HOSTS_RANK = HERE.parent / "packages" / "ds-launch" / "tests" / "scripts" / "hosts_rank.py"


@pytest.fixture(scope="module")
def slurm(cluster):
    from hosts._slurm import Slurm, slurm_unavailable_reason

    reason = slurm_unavailable_reason()
    if reason is not None:
        if os.environ.get("DS_TEST_HOSTS_REQUIRED") == "1":
            pytest.fail(f"DS_TEST_HOSTS_REQUIRED=1 but {reason}")
        pytest.skip(reason)
    with Slurm(cluster, cpus=2) as made:
        yield made


def _tool(name: str) -> list[str]:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    module = {"ds-launch": "ds_launch.cli", "deepspeed": "deepspeed.launcher.runner"}[name]
    return [found] if found else [sys.executable, "-m", module]


def _on_node0(cluster, slurm, argv: list[str], cwd: Path, timeout_s: float = 180):
    env = {**slurm.env, "OMP_NUM_THREADS": "1"}
    return cluster.run("node0", ["env", "-C", str(cwd), *argv], env=env, timeout=timeout_s)


def _records(out: Path, n: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


def test_ds_launch_slurm_launcher_runs_srun_across_hosts(cluster, slurm, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=1)
    cmd = [
        *_tool("ds-launch"),
        "-H",
        str(hostfile),
        "--launcher",
        "slurm",
        str(HOSTS_RANK),
        str(tmp_path),
        "3",
    ]
    proc = _on_node0(cluster, slurm, cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "srun -n 2 --nodes 2 --nodelist node0,node1 --ntasks-per-node 1" in proc.stderr
    seen = _records(tmp_path, 2)
    assert [(s["rank"], s["host"], s["local_rank"], s["world_size"]) for s in seen] == [
        (0, "node0", 0, 2), (1, "node1", 0, 2)
    ]  # fmt: skip
    assert {s["master_addr"] for s in seen} == {"node0"}
    assert all(s["gloo_ifname"] == "eth0" for s in seen)  # the interface that reaches node0


def test_a_script_started_by_srun_finds_its_ranks_from_slurm(cluster, slurm, tmp_path):
    cmd = ["srun", "-N", "2", "-n", "4", "--ntasks-per-node", "2", sys.executable, str(HOSTS_RANK),
           str(tmp_path), "3"]  # fmt: skip
    proc = _on_node0(cluster, slurm, cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    seen = _records(tmp_path, 4)
    assert [(s["rank"], s["host"], s["local_rank"], s["local_world_size"], s["world_size"]) for s in seen] == [
        (0, "node0", 0, 2, 4), (1, "node0", 1, 2, 4), (2, "node1", 0, 2, 4), (3, "node1", 1, 2, 4)
    ]  # fmt: skip
    # no launcher set MASTER_ADDR/PORT: the step's first host, a port from the job id
    assert {s["master_addr"] for s in seen} == {"node0"}
    assert len({s["master_port"] for s in seen}) == 1 and seen[0]["master_port"] >= 15000


def test_deepspeed_command_with_the_slurm_launcher(cluster, slurm, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=1)
    cmd = [*_tool("deepspeed"), "--hostfile", str(hostfile), "--launcher", "slurm", str(HOSTS_RANK),
           str(tmp_path), "2"]  # fmt: skip
    proc = _on_node0(cluster, slurm, cmd, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    seen = _records(tmp_path, 2)
    assert [(s["rank"], s["host"]) for s in seen] == [(0, "node0"), (1, "node1")]
    assert {(s["master_addr"], s["master_port"]) for s in seen} == {("node0", 29500)}  # DeepSpeed's port


def test_a_node_lost_under_slurm_ends_the_job_naming_it(cluster, slurm, tmp_path):
    hostfile = cluster.hostfile(tmp_path / "hostfile", slots=1)
    cmd = [*_tool("ds-launch"), "-H", str(hostfile), "--launcher", "slurm", "--heartbeat_timeout", "6",
           str(HOSTS_RANK), str(tmp_path), "100000"]  # fmt: skip
    job = cluster.popen("node0", ["env", "-C", str(tmp_path), *cmd], env={**slurm.env, "OMP_NUM_THREADS": "1"},
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "progress1").exists() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job.poll() is None, job.communicate()[1][-3000:]
        lost_at = time.monotonic()
        cluster.kill_host("node1")  # slurmd, slurmstepd and the rank: the node is gone
        _, stderr = job.communicate(timeout=90)
        ended_in = time.monotonic() - lost_at
    finally:
        if job.poll() is None:
            job.kill()
        slurm.start_node("node1")  # the node comes back for the tests after this one
    assert job.returncode != 0, stderr[-3000:]
    assert "node1" in stderr and "rank 1" in stderr, stderr[-3000:]
    assert ended_in < 60, f"the job took {ended_in:.0f} s to end after node1 was lost"

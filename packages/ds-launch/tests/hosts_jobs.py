"""Jobs on namespace test hosts (testing/hosts) for the multi-host tests: a 2 x 2 ds-launch job of
scripts/hosts_rank.py started from node0 through mpirun and the hosts' ssh-like agent."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from hosts import Cluster, require_hosts
from launch_procs import SCRIPTS, mpi_env

SCRIPT = SCRIPTS / "hosts_rank.py"
# the goal is 60 s with the default timeouts (tools/bench/bench_multihost.py measures it); this is a bound
FAULT_BOUND_S = 90.0
# shortened monitor timeouts: what is tested is that they end the job, not their defaults' length
MONITOR = ["--heartbeat_timeout", "8", "--stall_timeout", "15"]


def cluster_of_two():
    """Two hosts whose names resolve nowhere (only localhost in /etc/hosts), with a /tmp each."""
    require_hosts()
    return Cluster(2, etc_hosts="none", private_tmp=True)


def start(cluster: Cluster, out: Path, *script_args: str) -> subprocess.Popen:
    out.mkdir()
    hostfile = cluster.hostfile(out / "hostfile", slots=2)
    env = {k: v for k, v in mpi_env().items() if k.startswith("OMPI_ALLOW")}
    argv = ["ds-launch", "--hostfile", str(hostfile), *MONITOR,
            "--launcher_args", f"--mca plm_rsh_agent {cluster.ssh}", str(SCRIPT), str(out), *script_args]  # fmt: skip
    return cluster.popen("node0", argv, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=str(cluster.shared),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def finish(job: subprocess.Popen, timeout_s: float = 300) -> str:
    try:
        return job.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        job.kill()
        pytest.fail(f"the job did not end within {timeout_s} s: {job.communicate()[0][-3000:]}")


def wait_step(out: Path, rank: int, step: int, job: subprocess.Popen) -> None:
    progress = out / f"progress{rank}"
    while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= step):
        assert job.poll() is None, f"the job ended before step {step}: {job.communicate()[0][-3000:]}"
        time.sleep(0.1)

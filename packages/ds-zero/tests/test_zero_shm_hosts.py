"""Shared memory only between ranks of one host, never across, decided from what the ranks report.

Two namespace test hosts (testing/hosts) that share one /dev/shm (``own_shm=False``), so a file every rank
can open is there to mislead: ranks 0, 1 on node0 and 2, 3 on node1, started by mpirun through the hosts'
ssh-like agent, asking for the shared-memory transport by name (DS_ZERO_COLLECTIVES=shm) for the world
group, each host's pair and a pair across the hosts. Only the pairs within one host may take it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from hosts import Cluster, require_hosts

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi

MAIN = Path(__file__).with_name("_hosts_shm_main.py")


def test_shared_memory_joins_ranks_of_one_host_only():
    require_hosts()
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    with Cluster(2, own_shm=False) as cluster:
        argv = [mpirun, "-n", "4", "-H", "node0:2,node1:2", "--mca", "plm_rsh_agent", str(cluster.ssh),
                "-x", "DS_ZERO_COLLECTIVES=shm", "-x", f"MASTER_ADDR={cluster.address('node0')}",
                "-x", "MASTER_PORT=29555", *(["-x", "PYTHONPATH"] if "PYTHONPATH" in os.environ else []),
                sys.executable, str(MAIN)]  # fmt: skip
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        proc = cluster.run("node0", argv, env=env, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    taken = {r["rank"]: r["taken"] for r in lines}
    assert [next(r["host"] for r in lines if r["rank"] == k) for k in range(4)] == [
        "node0",
        "node0",
        "node1",
        "node1",
    ]
    assert {k: v["world"] for k, v in taken.items()} == dict.fromkeys(range(4), "torch")
    assert taken[0]["node0"] == taken[1]["node0"] == "shm"
    assert taken[2]["node1"] == taken[3]["node1"] == "shm"
    assert taken[1]["across"] == taken[2]["across"] == "torch"
    assert "the group's ranks are on 2 hosts (node0: ranks 0, 1; node1: ranks 2, 3)" in proc.stderr

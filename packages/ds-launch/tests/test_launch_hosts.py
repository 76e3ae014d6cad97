"""ds-launch across real (namespace) hosts (testing/hosts): mpirun starts the ranks through the hosts' ssh-like
agent, each host with its own hostname, network stack, /dev/shm and /tmp.

One 2 x 2 job per case: ranks find their place and train where the hosts' names resolve nowhere, and each
fault (a host lost, a rank that raises; a partition and a hang in test_launch_hosts_silence.py) ends the job
non-zero, soon, with a report that names the host and its ranks. The 60 s goal is measured by tools/bench/bench_multihost.py; here the bound is
generous (a loaded CI machine), and the monitor's timeouts are shortened so that each case takes seconds.
"""

from __future__ import annotations

import json
import time

import pytest
from hosts_jobs import FAULT_BOUND_S, cluster_of_two, finish, start, wait_step

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def cluster():
    with cluster_of_two() as made:
        yield made


def test_ranks_find_their_place_across_hosts_whose_names_resolve_nowhere(cluster):
    """Without the interface choice gloo binds to loopback (the hostname resolves to nothing) and the job
    never ends; here every rank trains, knows its host-local rank, and met rank 0 on node0's address."""
    out = cluster.shared / "topology"
    job = start(cluster, out, "5")
    log = finish(job)
    assert job.returncode == 0, log[-4000:]
    recs = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(4)}
    assert [recs[r]["host"] for r in range(4)] == ["node0", "node0", "node1", "node1"]
    assert [recs[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]
    assert {recs[r]["local_world_size"] for r in range(4)} == {2}
    assert {recs[r]["env_local_world_size"] for r in range(4)} == {"2"}  # published for code that reads it
    assert [recs[r]["env_local_rank"] for r in range(4)] == ["0", "1", "0", "1"]
    assert {(r["master_addr"], r["master_port"]) for r in recs.values()} == {
        (cluster.address("node0"), recs[0]["master_port"])
    }
    assert {r["gloo_ifname"] for r in recs.values()} == {"eth0"}  # chosen: it routes to the master


def test_lost_host_fails_the_job(cluster):
    """Every process of node1 SIGKILLed mid-run: mpirun says "A daemon failed to report back" and exits 0;
    ds-launch must not."""
    out = cluster.shared / "lost"
    job = start(cluster, out, "100000")
    wait_step(out, 3, 3, job)
    t_fault = time.monotonic()
    cluster.kill_host("node1")
    try:
        log = finish(job)
    finally:
        cluster.heal("node1")  # back up, for the next case
    assert time.monotonic() - t_fault < FAULT_BOUND_S
    assert job.returncode != 0, log[-4000:]
    assert "ranks 2, 3 on node1: ended without reporting how" in log or "host node1 (ranks 2, 3)" in log, log[
        -4000:
    ]


def test_a_rank_that_raises_while_the_others_wait_ends_the_job(cluster):
    out = cluster.shared / "raise"
    job = start(cluster, out, "100000", "raise", "3", "3")
    wait_step(out, 0, 2, job)
    t_fault = time.monotonic()
    log = finish(job)
    assert time.monotonic() - t_fault < FAULT_BOUND_S
    assert job.returncode == 1, log[-4000:]
    assert "rank 3 on node1 exited with code 1 (RuntimeError: injected failure at step 3)" in log, log[-4000:]

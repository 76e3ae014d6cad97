"""Faults that leave the job silent rather than failed, across namespace hosts (testing/hosts): a host cut off
from the network, a rank that hangs while the others wait in a collective. Neither ends a process, so only
ds-launch's monitor (heartbeats, progress) can end the job. Beside test_launch_hosts.py, so that the two run
in parallel (most of these cases is waiting)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hosts_jobs import FAULT_BOUND_S, SCRIPT, cluster_of_two, finish, start, wait_step

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def cluster():
    with cluster_of_two() as made:
        yield made


def test_partitioned_host_ends_the_job(cluster):
    out = cluster.shared / "partition"
    job = start(cluster, out, "100000")
    wait_step(out, 3, 3, job)
    t_fault = time.monotonic()
    cluster.partition("node1")
    try:
        log = finish(job)
        t_end = time.monotonic()
        # cut off, node1's ranks cannot be stopped by mpirun or ds-launch: their beaters, which lose the
        # launcher too, end them (seen inside node1, still cut off)
        left = _ranks_on(cluster, "node1", within_s=FAULT_BOUND_S)
    finally:
        cluster.heal("node1")
        cluster.kill_host("node1")  # mpirun's daemon there, cut off from mpirun, outlives the job
        cluster.heal("node1")
    assert t_end - t_fault < FAULT_BOUND_S
    assert job.returncode != 0, log[-4000:]
    assert "host node1 (ranks 2, 3): no heartbeat for" in log, log[-4000:]
    assert "Ranks by host: node0: 0, 1; node1: 2, 3" in log
    assert not left, (
        f"ranks still running on the cut-off node1 {FAULT_BOUND_S:.0f} s after the job ended: {left}"
    )


def _ranks_on(cluster, host: str, within_s: float) -> list[str]:
    """The job's rank processes (not zombies) still on ``host`` once they have had ``within_s`` to end."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for pid in cluster.pids(host):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if SCRIPT.name in cmdline and state != "Z":
                left.append(f"{pid}: {cmdline}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_rank_that_hangs_on_one_host_ends_the_job(cluster):
    out = cluster.shared / "hang"
    job = start(cluster, out, "100000", "hang", "3", "3")
    wait_step(out, 0, 2, job)
    t_fault = time.monotonic()
    log = finish(job)
    assert time.monotonic() - t_fault < FAULT_BOUND_S
    assert job.returncode != 0, log[-4000:]
    # the hung rank is named first, where its main thread is (the sleep in the script); the others wait
    # in a collective
    assert "no rank made progress for" in log, log[-4000:]
    suspects = log.split("every rank is blocked.")[1].splitlines()
    assert suspects[1].startswith("ds-launch:   rank 3 on node1 (pid") and "hosts_rank.py:" in suspects[1], (
        log[-3000:]
    )
    assert all("distributed_c10d.py" in line for line in suspects[2:5]), log[-3000:]

"""Hosts with two interfaces (testing/hosts' ``second_network``): ds picks the one that routes to the master
address, names it in the startup line, and where none routes the job ends soon naming GLOO_SOCKET_IFNAME.

node0 and node1 are on two networks (eth0, eth1), node2 only on the first; every host name resolves to its
first-network address (as a cluster whose DNS names its management network). Jobs run under ds-launch's ssh
launcher (no MPI: the rendezvous is the only use of the networks) from node0, with the master address given
as node0's second-network address.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from hosts import Cluster, require_hosts
from hosts_jobs import FAULT_BOUND_S, MONITOR, SCRIPT


@pytest.fixture(scope="module")
def cluster():
    require_hosts()
    with Cluster(3, second_network=["node0", "node1"]) as made:
        yield made


def _launch(
    cluster: Cluster, out, hosts: list[str], steps: str = "5"
) -> tuple[subprocess.CompletedProcess, float]:
    out.mkdir()
    hostfile = cluster.hostfile(out / "hostfile", slots=2, names=hosts)
    argv = [sys.executable, "-m", "ds_launch.cli", "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd",
            str(cluster.ssh), "--master_addr", cluster.address("node0", net=1), *MONITOR,
            "--export", "OMP_NUM_THREADS=1", str(SCRIPT), str(out), steps]  # fmt: skip
    start = time.monotonic()
    proc = cluster.run("node0", ["env", "-C", str(cluster.shared), *argv], timeout=300)
    return proc, time.monotonic() - start


def test_the_master_reachable_only_on_the_second_network(cluster):
    """node1's first network is dead (its cable cut, its eth0 still up and routed): gloo left to itself
    binds to what the host names resolve to (the first network) and the job never trains; ds picks eth1,
    which routes to the master address, says so in the startup line, and the job trains."""
    cluster.partition("node1", net=0)
    try:
        proc, _ = _launch(cluster, cluster.shared / "second", ["node0", "node1"])
    finally:
        cluster.heal("node1")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    recs = [json.loads((cluster.shared / "second" / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["host"] for r in recs] == ["node0", "node0", "node1", "node1"]
    assert {r["gloo_ifname"] for r in recs} == {"eth1"}
    for r, host in zip(range(4), ["node0", "node0", "node1", "node1"]):
        assert recs[r]["interface"].startswith(
            f"eth1 {cluster.address(host, net=1)} (routes to the master"
        ), recs[r]
        startup = [
            line for line in log.splitlines() if f"startup: rank {r}/4 " in line
        ]  # Topology.describe()
        assert len(startup) == 1, log[-4000:]
        assert f"network eth1 {cluster.address(host, net=1)} (routes to the master" in startup[0], startup[0]
    assert all(int((cluster.shared / "second" / f"progress{r}").read_text()) == 4 for r in range(4))


def test_no_interface_routes_to_the_master(cluster):
    """node2 is not on the master's network and has no default route: its ranks cannot choose an interface;
    the job ends non-zero soon (not at the 30-minute rendezvous timeout), naming GLOO_SOCKET_IFNAME."""
    proc, took = _launch(cluster, cluster.shared / "unroutable", ["node0", "node2"])
    log = proc.stdout + proc.stderr
    assert took < FAULT_BOUND_S, log[-4000:]
    assert proc.returncode != 0, log[-4000:]
    assert "on node2" in log and "no route to the master address" in log, log[-4000:]
    assert "set GLOO_SOCKET_IFNAME" in log, log[-4000:]

"""Test hosts: N "machines" on this one, made from Linux namespaces, for multi-host tests (see README.md).

from hosts import Cluster, cluster_fixture

cluster = cluster_fixture(3)            # a pytest fixture (module scope), skips where hosts cannot be made

def test_two_hosts(cluster, tmp_path):
    cluster.run("node0", ["hostname"]).stdout          # 'node0\\n'
    hostfile = cluster.hostfile(tmp_path / "hosts", slots=2, names=["node0", "node1"])
    # mpirun ... --mca plm_rsh_agent {cluster.ssh}   /   ds-launch --launcher ssh with cluster.ssh
"""

from __future__ import annotations

import os

from hosts._cluster import Cluster, Host, HostsUnavailable, unavailable_reason

__all__ = ["Cluster", "Host", "HostsUnavailable", "cluster_fixture", "require_hosts", "unavailable_reason"]

REQUIRED_ENV = "DS_TEST_HOSTS_REQUIRED"


def require_hosts() -> None:
    """Skip the calling test where test hosts cannot be made, saying why; fail instead where
    ``DS_TEST_HOSTS_REQUIRED=1`` (CI sets it: there a skip would hide the multi-host tests)."""
    import pytest

    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get(REQUIRED_ENV) == "1":
        pytest.fail(f"{REQUIRED_ENV}=1 but {reason}")
    pytest.skip(reason)


def cluster_fixture(n: int = 3, *, scope: str = "module", **cluster_kwargs):
    """A pytest fixture yielding a :class:`Cluster` of ``n`` hosts, torn down after its scope (also when a test
    fails; a reaper process covers a killed pytest). Assign it to a module-level name to use it."""
    import pytest

    @pytest.fixture(scope=scope)
    def cluster():
        require_hosts()
        with Cluster(n, **cluster_kwargs) as made:
            yield made

    return cluster

"""The test hosts are what they claim: separate hostnames, /dev/shm and addresses, an ssh-like agent, faults that
take effect, and nothing left behind (also when the owning process is SIGKILLed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hosts import Cluster, _netns, cluster_fixture, require_hosts

cluster = cluster_fixture(3)


def _sh(cluster: Cluster, name: str, script: str, **kwargs) -> subprocess.CompletedProcess:
    return cluster.run(name, ["/bin/sh", "-c", script], **kwargs)


def test_each_host_has_its_own_hostname_shm_and_address(cluster):
    for name in cluster.names:
        assert _sh(cluster, name, "hostname").stdout.strip() == name
        addrs = _sh(cluster, name, "ip -4 -o addr show dev eth0").stdout
        assert f"{cluster.address(name)}/24" in addrs
    _sh(cluster, "node0", f"echo mine > /dev/shm/{cluster.prefix}_probe")
    assert _sh(cluster, "node0", f"cat /dev/shm/{cluster.prefix}_probe").stdout == "mine\n"
    assert _sh(cluster, "node1", f"cat /dev/shm/{cluster.prefix}_probe").returncode != 0
    assert not Path(f"/dev/shm/{cluster.prefix}_probe").exists()  # nor on the machine itself
    (cluster.shared / "note").write_text("seen everywhere")
    assert _sh(cluster, "node2", f"cat {cluster.shared}/note").stdout == "seen everywhere"


def test_private_tmp():
    require_hosts()
    with Cluster(2, private_tmp=True) as c:
        _sh(c, "node0", "echo mine > /tmp/dsth_probe")
        assert _sh(c, "node0", "cat /tmp/dsth_probe").stdout == "mine\n"
        assert _sh(c, "node1", "cat /tmp/dsth_probe").returncode != 0
        assert (
            subprocess.run([str(c.ssh), "node1", "hostname"], capture_output=True, text=True).stdout
            == "node1\n"
        )


def test_hosts_reach_each_other_by_name_over_their_own_link(cluster):
    server = cluster.popen(
        "node1",
        [sys.executable, "-c", textwrap.dedent("""
            import socket
            s = socket.socket(); s.bind(("0.0.0.0", 5999)); s.listen(); print("up", flush=True)
            conn, peer = s.accept(); print(peer[0], conn.recv(16).decode(), flush=True)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout.readline() == "up\n"
    client = "import socket; socket.create_connection(('node1', 5999), timeout=10).send(b'hello')"
    assert cluster.run("node2", [sys.executable, "-c", client]).returncode == 0
    out, _ = server.communicate(timeout=30)
    assert out.split() == [cluster.address("node2"), "hello"]


def test_agent_behaves_like_ssh(cluster):
    ssh = str(cluster.ssh)
    # options skipped, user@ dropped, words joined for the remote shell, exit status passed back
    out = subprocess.run([ssh, "-x", "-o", "BatchMode=yes", "root@node2", "echo", "$(hostname)", ";", "exit", "3"],
                         capture_output=True, text=True)  # fmt: skip
    assert (out.returncode, out.stdout) == (3, "node2\n")
    # by address, from another host, in a login environment (nothing of the caller's), in $HOME
    out = cluster.run("node0", [ssh, cluster.address("node1"), "hostname; pwd; echo ${CALLER_ONLY:-unset}"],
                      env={"CALLER_ONLY": "1"})  # fmt: skip
    assert out.stdout.split() == ["node1", os.path.expanduser("~"), "unset"]
    unknown = subprocess.run([ssh, "node9", "true"], capture_output=True, text=True)
    assert unknown.returncode == 255 and "Could not resolve hostname node9" in unknown.stderr


def test_etc_hosts_modes():
    require_hosts()
    probe = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
    with Cluster(2, etc_hosts="none") as c:
        assert c.run("node0", [sys.executable, "-c", probe, "node1"]).returncode != 0
        assert c.run("node0", [sys.executable, "-c", probe, "node0"]).returncode != 0
    with Cluster(2, etc_hosts="self-loopback") as c:
        assert c.run("node0", [sys.executable, "-c", probe, "node0"]).stdout.strip() == "127.0.1.1"
        assert c.run("node0", [sys.executable, "-c", probe, "node1"]).returncode != 0


def test_kill_host_and_partition(cluster):
    sleeper = cluster.popen("node2", ["sleep", "300"])
    deadline = time.monotonic() + 20  # nsenter joins node2's namespaces a moment after it starts
    while sleeper.pid not in cluster.pids("node2") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper.pid in cluster.pids("node2")
    assert sleeper.pid in cluster.kill_host("node2")
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert cluster.pids("node2") == []
    refused = subprocess.run([str(cluster.ssh), "node2", "true"], capture_output=True, text=True)
    assert refused.returncode == 255 and "lost" in refused.stderr
    cluster.heal("node2")
    assert subprocess.run([str(cluster.ssh), "node2", "true"]).returncode == 0

    connect = f"import socket; socket.create_connection(('{cluster.address('node1')}', 22), timeout=2)"
    # before: refused at once (the host answers); during the partition: no answer at all
    assert "ConnectionRefusedError" in cluster.run("node0", [sys.executable, "-c", connect]).stderr
    cluster.partition("node1")
    try:
        assert "TimeoutError" in cluster.run("node0", [sys.executable, "-c", connect]).stderr
    finally:
        cluster.heal("node1")
    # healed: answered again (the neighbour entry that failed during the cut may take a retry to refresh)
    deadline = time.monotonic() + 20
    while "ConnectionRefusedError" not in (
        seen := cluster.run("node0", [sys.executable, "-c", connect]).stderr
    ):
        assert time.monotonic() < deadline, seen
        time.sleep(0.5)


def test_a_second_network_and_cutting_one_of_two(tmp_path):
    """``second_network``: those hosts also get eth1 on a /24 of their own bridge; ``partition(name, net=0)``
    cuts only eth0's cable (node1 still reaches node0 on the second network, not on the first)."""
    require_hosts()
    probe = "import socket, sys; socket.create_connection((sys.argv[1], 22), timeout=2)"

    def answer(c: Cluster, frm: str, address: str) -> str:
        err = c.run(frm, [sys.executable, "-c", probe, address]).stderr
        return "refused" if "ConnectionRefusedError" in err else "silent" if "TimeoutError" in err else err

    with Cluster(3, second_network=["node0", "node1"]) as c:
        assert len(c.subnets) == 2 and c.subnets[0] != c.subnets[1]
        for name in ("node0", "node1"):
            eth1 = _sh(c, name, "ip -4 -o addr show dev eth1").stdout
            assert f"{c.address(name, net=1)}/24" in eth1 and c.address(name, net=1) != c.address(name)
        assert _sh(c, "node2", "ip link show dev eth1").returncode != 0  # on the first network only
        assert answer(c, "node1", c.address("node0", net=1)) == "refused"  # reached, nothing listens
        c.partition("node1", net=0)
        assert answer(c, "node1", c.address("node0", net=1)) == "refused"
        assert answer(c, "node1", c.address("node0")) == "silent"
        assert subprocess.run([str(c.ssh), "node1", "true"]).returncode == 0  # not down: one cable left
        c.heal("node1")


def test_nothing_left_after_close_or_after_the_owner_is_killed(tmp_path):
    require_hosts()
    with Cluster(2) as c:
        prefix, sleeper = c.prefix, c.popen("node1", ["sleep", "300"])
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert not [ns for ns in _netns.list_netns() if ns.startswith(prefix)]
    assert not (_netns.state_root() / prefix).exists()

    # an owner SIGKILLed with its hosts up and a job running on them: its reaper tears everything down
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from hosts import Cluster
            c = Cluster(2)
            c.popen("node0", ["sleep", "300"])
            print(c.prefix, flush=True)
            time.sleep(300)
        """)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )  # fmt: skip
    prefix = owner.stdout.readline().strip()
    assert prefix.startswith(_netns.PREFIX_STEM)
    pids = [p for ns in _netns.list_netns() if ns.startswith(prefix) for p in _netns.netns_pids(ns)]
    assert len(pids) >= 3  # two holders and the job
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 30
    while (_netns.state_root() / prefix).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (_netns.state_root() / prefix).exists()
    assert not [ns for ns in _netns.list_netns() if ns.startswith(prefix)]
    assert not [p for p in pids if Path(f"/proc/{p}").exists() and _netns._alive(p)]


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the non-root check as another user, which needs root")
def test_not_root_gives_the_reason_to_skip_with():
    # the interpreter and hosts are loaded as root, then the process runs as uid 65534: a clone (and its venv)
    # under a home that uid cannot enter, such as /root, still runs the check
    probe = (
        "import os\nfrom hosts import Cluster\nos.setegid(65534)\nos.seteuid(65534)\n"
        "try:\n    Cluster(1)\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True, text=True, cwd="/", env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )  # fmt: skip
    assert (
        out.stdout.strip()
        == "HostsUnavailable test hosts need root for network namespaces (running as uid 65534)"
    )

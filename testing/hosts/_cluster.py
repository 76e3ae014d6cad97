"""N test hosts on this machine: a network namespace each on one bridge, with its own hostname and /dev/shm."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hosts import _netns
from hosts._agent import default_login_env, write_agent, write_env

__all__ = ["Cluster", "Host", "HostsUnavailable", "unavailable_reason"]

# The holder: one long-lived process per host, made inside the host's network namespace with its own UTS and
# mount namespaces (`unshare` without --fork execs it in place, so the Popen's pid is the holder). Everything
# that enters the host later joins these three namespaces through it (nsenter -t HOLDER -u -m -n).
_HOLDER = r"""
set -e
hostname "$1"
if [ "$5" = own ]; then mount -t tmpfs -o mode=1777 shm /dev/shm; fi
if [ -n "$2" ]; then mount --bind "$2" /etc/hosts; fi
pidfile="$3"
if [ "$4" = private ]; then
  # a tmpfs of its own over /tmp; what the job runs from (a checkout or a venv under /tmp, arguments 6...)
  # is bound back from the machine's /tmp, as a shared home would hold it on a cluster
  machine_tmp="$(dirname "$pidfile")/machine_tmp"
  mkdir -p "$machine_tmp"
  mount --bind /tmp "$machine_tmp"
  mount -t tmpfs -o mode=1777 tmp /tmp
  shift 5
  for keep in "$@"; do
    mkdir -p "$keep"
    mount --bind "$machine_tmp/${keep#/tmp/}" "$keep"
  done
fi
echo $$ > "$pidfile.tmp"
mv "$pidfile.tmp" "$pidfile"
exec sleep infinity
"""


def _under_tmp(login_env: Mapping[str, str]) -> list[str]:
    """The folders directly under /tmp that this job runs from: the checkout, the interpreter's venv, the
    PYTHONPATH and PATH of a login. A host with a private /tmp still sees them (a clone under /tmp is then
    what an NFS home is on a cluster); everything else in the machine's /tmp stays hidden."""
    tmp = Path("/tmp").resolve()
    candidates = [Path(__file__).resolve().parents[2], Path(sys.prefix), Path(sys.executable).parent]
    for name in ("PYTHONPATH", "PATH"):
        candidates += [Path(p) for p in login_env.get(name, "").split(os.pathsep) if p]
    found = []
    for path in candidates:
        path = path.resolve()
        if path.is_relative_to(tmp) and path != tmp:
            top = str(Path("/tmp") / path.relative_to(tmp).parts[0])
            if top not in found and Path(top).is_dir():
                found.append(top)
    return found


# network i: bridge br<i> in the hub, a veth per host from port p<i>-<host index> to eth<i> in the host
_BRIDGE = "br{}"
_HOST_IFNAME = "eth{}"
_PORT = "p{}-{}"


class HostsUnavailable(RuntimeError):
    """Test hosts cannot be made on this machine (not root, no `ip`/`unshare`/`nsenter`)."""


def unavailable_reason() -> str | None:
    """Why test hosts cannot be made here, or None when they can (checked without making anything)."""
    if os.geteuid() != 0:
        return f"test hosts need root for network namespaces (running as uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        return f"test hosts need {', '.join(missing)} on PATH (iproute2, util-linux)"
    return None


@dataclass(frozen=True)
class Host:
    name: str  # its hostname (the UTS namespace's)
    address: str  # its IPv4 address on the cluster's first network (eth0)
    netns: str  # the network namespace, as `ip netns list` names it
    holder_pid: int  # nsenter -t HOLDER -u -m -n enters the host
    # its address on each network it is on, by network index (eth<i>): {0: address, 1: ...}
    addresses: Mapping[int, str] = field(default_factory=dict)


class Cluster:
    """``Cluster(3)`` makes hosts ``node0..node2`` on a private /24 (10.x.y.0/24, random per run, isolated: the
    bridge lives in its own namespace, so runs side by side never see each other's addresses).

    ``etc_hosts`` decides what each host's /etc/hosts says: ``"all"`` (every host's name -> its address, as a
    cluster with working DNS), ``"none"`` (only localhost: no host's name resolves anywhere, its own included),
    ``"self-loopback"`` (a host's own name -> 127.0.1.1, as Debian writes it; the others unresolvable), or a
    mapping host name -> file text. ``private_tmp=True`` gives each host its own empty /tmp (as separate machines
    have; then only ``cluster.shared``, a folder every host sees as a cluster's shared home, is common to
    them). ``own_shm=False`` leaves the machine's /dev/shm shared by all hosts (to check that "same host" is
    not inferred from a shared file). ``second_network`` names hosts that are also on a second /24 of their own
    bridge, as ``eth1`` (a host with two interfaces; the others have only ``eth0``): ``address(name, net=1)``,
    ``partition(name, net=0)`` cuts only the first. ``login_env`` is what a login on each host starts with (see
    :func:`hosts._agent.default_login_env`). Close it (or use ``with``) to tear everything down; a reaper
    process does it if this process dies first, and the next run sweeps anything a reaper missed.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        etc_hosts: str | Mapping[str, str] = "all",
        login_env: Mapping[str, str] | None = None,
        names: Sequence[str] | None = None,
        private_tmp: bool = False,
        own_shm: bool = True,
        second_network: Sequence[str] = (),
    ) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise HostsUnavailable(reason)
        _netns.clean_stale()
        self.names = list(names or [f"node{i}" for i in range(n)])
        self.prefix = _new_prefix()
        self.state = _netns.state_root() / self.prefix
        self.state.mkdir(parents=True)
        (self.state / _netns.OWNER_FILE).write_text(json.dumps(_netns.owner_record()))
        self._closed = False
        self._private_tmp = private_tmp
        self._own_shm = own_shm
        self.shared = self.state / "shared"  # seen by every host, as a shared home on a cluster
        self.shared.mkdir()
        self._holders: list[subprocess.Popen] = []
        try:
            self._start_reaper()
            nets = [f"10.{random.randint(64, 250)}.{third}" for third in random.sample(range(256), 2)]
            on_net = [self.names, [n for n in self.names if n in second_network]]
            if len(on_net[1]) != len(second_network):
                raise ValueError(f"second_network={list(second_network)} names a host not in {self.names}")
            self.hosts = {}
            for net_index, net in enumerate(nets[: 2 if second_network else 1]):
                self._make_bridge(net_index)
                for name in on_net[net_index]:
                    self._join(net_index, name, f"{net}.{10 + self.names.index(name)}")
            self.subnet = f"{nets[0]}.0/24"
            self.subnets = [f"{net}.0/24" for net in nets[: 2 if second_network else 1]]
            hosts_text = _etc_hosts(etc_hosts, self.hosts)
            for name, host in self.hosts.items():
                self._start_holder(host, hosts_text.get(name), dict(login_env or default_login_env()))
            self.ssh = write_agent(self.state / "bin" / "ssh", self.prefix, self.state / "hosts")
        except BaseException:
            self.close()
            raise

    # --- making ---------------------------------------------------------------------------------------
    def _start_reaper(self) -> None:
        subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_reaper.py")), self.prefix],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives a SIGKILLed test and its process group
            env={**os.environ, "DS_TEST_HOSTS_DIR": str(_netns.state_root())},
        )

    def _ns(self, what: str) -> str:
        return f"{self.prefix}-{what}"

    def _make_bridge(self, net: int) -> None:
        hub = self._ns("hub")
        if net == 0:
            _netns.ip("netns", "add", hub)
        bridge = _BRIDGE.format(net)
        _netns.ip("-n", hub, "link", "add", bridge, "type", "bridge", "forward_delay", "0")
        _netns.ip("-n", hub, "link", "set", bridge, "up")

    def _join(self, net: int, name: str, address: str) -> None:
        """Put host ``name`` on network ``net`` (made with its first network): a veth from the hub's bridge
        to eth<net> in the host, with ``address``/24."""
        hub, netns = self._ns("hub"), self._ns(name)
        if net == 0:
            _netns.ip("netns", "add", netns)
            _netns.ip("-n", netns, "link", "set", "lo", "up")
            self.hosts[name] = Host(name=name, address=address, netns=netns, holder_pid=0)
        port, ifname = _PORT.format(net, self.names.index(name)), _HOST_IFNAME.format(net)
        _netns.ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", netns)
        _netns.ip("-n", hub, "link", "set", port, "master", _BRIDGE.format(net), "up")
        _netns.ip("-n", netns, "addr", "add", f"{address}/24", "dev", ifname)
        _netns.ip("-n", netns, "link", "set", ifname, "up")
        host = self.hosts[name]
        self.hosts[name] = replace(host, addresses={**host.addresses, net: address})

    def _start_holder(self, host: Host, hosts_text: str | None, login_env: dict[str, str]) -> None:
        folder = self.state / "hosts" / host.name
        folder.mkdir(parents=True)
        hosts_file = ""
        if hosts_text is not None:
            (folder / "etc_hosts").write_text(hosts_text)
            hosts_file = str(folder / "etc_hosts")
        write_env(folder / "env.sh", login_env)
        pidfile = folder / "pid"
        tmp = "private" if self._private_tmp else "shared"
        holder = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                host.netns,
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                _HOLDER,
                "holder",
                host.name,
                hosts_file,
                str(pidfile),
                tmp,
                "own" if self._own_shm else "shared",
                *(_under_tmp(login_env) if self._private_tmp else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._holders.append(holder)
        deadline = time.monotonic() + 30
        while not pidfile.exists():
            if holder.poll() is not None:
                raise RuntimeError(
                    f"test host {host.name}: its holder exited: {holder.stderr.read().decode()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"test host {host.name}: its holder did not start in 30 s")
            time.sleep(0.02)
        pid = int(pidfile.read_text())
        self.hosts[host.name] = replace(host, holder_pid=pid)
        # the agent finds a host by its addresses too (ssh 10.x.y.11)
        for address in host.addresses.values():
            (self.state / "hosts" / address).symlink_to(host.name)

    # --- using ----------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def address(self, name: str, net: int = 0) -> str:
        """Host ``name``'s address on network ``net`` (0: eth0, 1: eth1 of the hosts in ``second_network``)."""
        return self.hosts[name].addresses[net]

    def enter_argv(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
        """An argument list that runs ``argv`` on host ``name`` in its login environment plus ``env`` (no
        shell in between, so no quoting), for subprocess."""
        login = _read_env(self.state / "hosts" / name / "env.sh")
        merged = {**login, **(env or {})}
        return ["nsenter", "-t", str(self.hosts[name].holder_pid), "-u", "-m", "-n", "--", "env", "-i",
                *[f"{k}={v}" for k, v in merged.items()], *argv]  # fmt: skip

    def popen(
        self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs
    ) -> subprocess.Popen:
        return subprocess.Popen(self.enter_argv(name, argv, env), **kwargs)

    def run(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs):
        """``subprocess.run`` of ``argv`` on host ``name`` (text output captured unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.enter_argv(name, argv, env), **kwargs)

    def hostfile(
        self, path: Path, slots: int | Mapping[str, int] = 2, names: Sequence[str] | None = None
    ) -> Path:
        """A DeepSpeed/ds-launch hostfile (``name slots=N`` lines) naming ``names`` (default: every host)."""
        names = list(names or self.names)
        per_host = slots if isinstance(slots, Mapping) else {n: slots for n in names}
        path.write_text("".join(f"{n} slots={per_host[n]}\n" for n in names))
        return path

    def pids(self, name: str) -> list[int]:
        """Every process on host ``name`` but its holder (what a job started there)."""
        return [p for p in _netns.netns_pids(self.hosts[name].netns) if p != self.hosts[name].holder_pid]

    # --- faults ---------------------------------------------------------------------------------------
    def kill_host(self, name: str) -> list[int]:
        """The host is lost: SIGKILL every process on it, and ssh to it fails from now on. Returns the pids."""
        self._mark_down(name, "lost: every process SIGKILLed")
        pids = self.pids(name)
        _netns.kill_pids(pids)
        return pids

    def partition(self, name: str, net: int | None = None) -> None:
        """Cut the host's cables (``net``: only the one to that network): its bridge ports go down, packets to
        and from it vanish without a reply. Its own interfaces stay up, addressed and routed, as a host
        behind a dead switch sees them. Cut from every network, it is down for ssh too."""
        nets = list(self.hosts[name].addresses) if net is None else [net]
        if net is None:
            self._mark_down(name, "partitioned: its link is down")
        for index in nets:
            port = _PORT.format(index, self.names.index(name))
            _netns.ip("-n", self._ns("hub"), "link", "set", port, "down")

    def heal(self, name: str) -> None:
        """Undo :meth:`partition` / the ssh refusal of :meth:`kill_host`."""
        for index in self.hosts[name].addresses:
            _netns.ip("-n", self._ns("hub"), "link", "set", _PORT.format(index, self.names.index(name)), "up")
        for host in self.hosts.values():  # neighbours that failed to answer during the cut: ask afresh
            _netns.ip("-n", host.netns, "neigh", "flush", "all", check=False)
        (self.state / "hosts" / name / "down").unlink(missing_ok=True)

    def _mark_down(self, name: str, why: str) -> None:
        (self.state / "hosts" / name / "down").write_text(why)

    # --- teardown -------------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _netns.teardown(self.prefix)
        for holder in self._holders:
            holder.wait()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _new_prefix() -> str:
    taken = {ns.split("-", 1)[0] for ns in _netns.list_netns()}
    root = _netns.state_root()
    while True:
        prefix = f"{_netns.PREFIX_STEM}{random.getrandbits(24):06x}"
        if prefix not in taken and not (root / prefix).exists():
            return prefix


def _etc_hosts(mode: str | Mapping[str, str], hosts: Mapping[str, Host]) -> dict[str, str | None]:
    local = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    if isinstance(mode, Mapping):
        return {name: mode.get(name) for name in hosts}
    if mode == "all":
        text = local + "".join(f"{h.address}\t{h.name}\n" for h in hosts.values())
        return {name: text for name in hosts}
    if mode == "none":
        return {name: local for name in hosts}
    if mode == "self-loopback":
        return {name: f"{local}127.0.1.1\t{name}\n" for name in hosts}
    raise ValueError(f"etc_hosts={mode!r}: expected 'all', 'none', 'self-loopback' or a mapping name -> text")


def _read_env(path: Path) -> dict[str, str]:
    """The login environment written by write_env, read back (one ``export K='v'`` per line)."""
    import shlex

    env = {}
    for line in path.read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0] if value else ""
    return env

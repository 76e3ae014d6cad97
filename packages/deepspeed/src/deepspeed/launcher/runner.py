"""DeepSpeed's ``deepspeed.launcher.runner``: the ``deepspeed`` command, mapped onto ds-launch.

``deepspeed [options] script.py [args]`` takes DeepSpeed 0.19.8's options (``parse_args``) and runs
ds-launch: one host -> its local launcher; several hosts (or ``--force_multi``) -> ``--launcher pdsh``
(the default) runs ds-launch's pdsh launcher when pdsh is installed, else its ssh launcher (one ssh per
host); ``--launcher openmpi`` runs its mpirun launcher. Hostfile parsing and the include/exclude filter
are ds-launch's (``ds_launch._hostfile``): the functions here give them DeepSpeed's names and return
types. On CPU, ``--num_gpus`` is the number of processes per host.

Options ds cannot honour raise ``FeatureNotAvailableError`` naming the option; none is ignored.
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import ds_launch
from ds_engine import FeatureNotAvailableError
from ds_engine._missing import missing_function as _missing_function
from ds_launch.cli import run as _run_ds_launch

from deepspeed.launcher.constants import (
    IMPI_LAUNCHER,
    MPICH_LAUNCHER,
    MVAPICH_LAUNCHER,
    OPENMPI_LAUNCHER,
    PDSH_LAUNCHER,
    PDSH_MAX_FAN_OUT,
    SLURM_LAUNCHER,
)
from deepspeed.launcher.multinode_runner import (
    IMPIRunner,
    MPICHRunner,
    MVAPICHRunner,
    OpenMPIRunner,
    PDSHRunner,
    SlurmRunner,
    ds_launch_argv,
)
from deepspeed.utils.logging import logger

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500
DLTS_HOSTFILE = "/job/hostfile"
EXPORT_ENVS = ["MLFLOW", "PYTHON", "MV2", "UCX"]  # + NCCL (the accelerator's); ds-launch exports the same
DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")
DEEPSPEED_ENVIRONMENT_PATHS = [os.path.expanduser("~"), "."]
EXCLUDE_ENVS = {"AISC_JOB_NAME": ["NCCL_IB_HCA", "UCX_NET_DEVICES"]}

LAUNCHER_CLASSES = {
    PDSH_LAUNCHER: PDSHRunner,
    OPENMPI_LAUNCHER: OpenMPIRunner,
    MPICH_LAUNCHER: MPICHRunner,
    IMPI_LAUNCHER: IMPIRunner,
    MVAPICH_LAUNCHER: MVAPICHRunner,
    SLURM_LAUNCHER: SlurmRunner,
}

# DeepSpeed options whose feature ds does not have: using one is an error naming it, never ignored.
UNAVAILABLE_OPTIONS = {
    "autotuning": "DeepSpeed's autotuner (--autotuning)",
    "enable_each_rank_log": "per-rank log files (--enable_each_rank_log); redirect ds-launch's output, whose "
    "lines each name their rank with --tag_output",
}

__all__ = [
    "DLTS_HOSTFILE",
    "EXPORT_ENVS",
    "DEEPSPEED_ENVIRONMENT_NAME",
    "DEEPSPEED_ENVIRONMENT_PATHS",
    "PDSH_MAX_FAN_OUT",
    "EXCLUDE_ENVS",
    "LAUNCHER_CLASSES",
    "parse_args",
    "fetch_hostfile",
    "parse_node_config",
    "parse_node_config_list",
    "parse_resource_filter",
    "parse_inclusion_exclusion",
    "apply_num_nodes_and_gpus",
    "encode_world_info",
    "main",
]


def parse_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """DeepSpeed 0.19.8's runner arguments, with its names and defaults."""
    p = argparse.ArgumentParser(
        description="DeepSpeed runner (ds): launch a training script on one or more hosts through ds-launch.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("-H", "--hostfile", type=str, default=DLTS_HOSTFILE, help="'HOSTNAME slots=N' per line")
    p.add_argument(
        "-i", "--include", type=str, default="", help="NODE_SPEC[@NODE_SPEC ...], NAME[:SLOT[,SLOT]]"
    )
    p.add_argument(
        "-e", "--exclude", type=str, default="", help="same syntax as --include; mutually exclusive"
    )
    p.add_argument("--num_nodes", type=int, default=-1, help="use the first N hosts of the hostfile")
    p.add_argument(
        "--num_gpus",
        "--num_accelerators",
        type=int,
        default=-1,
        help="ranks per host: GPUs [0:N) on each host; on CPU, N processes per host",
    )
    p.add_argument("--master_port", default=TORCH_DISTRIBUTED_DEFAULT_PORT, type=int, help="rendezvous port")
    p.add_argument("--master_addr", default="", type=str, help="rank 0's address (default: 'hostname -I')")
    p.add_argument("--node_rank", default=-1, type=int, help="this host's index, with --no_ssh")
    p.add_argument(
        "--launcher",
        default=PDSH_LAUNCHER,
        type=str,
        help="multi-host backend: pdsh (pdsh when installed, else ssh), openmpi, mpich, mvapich or slurm (srun); "
        "impi is not available in ds",
    )
    p.add_argument("--launcher_args", default="", type=str, help="arguments for pdsh or mpirun, one string")
    p.add_argument("--module", action="store_true", help="run the script as a module (python -m)")
    p.add_argument("--no_python", action="store_true", help="run the script itself, not through python")
    p.add_argument("--no_local_rank", action="store_true", help="do not pass --local_rank=<i> to the script")
    p.add_argument("--no_ssh", action="store_true", help="run this host's share only (with --node_rank)")
    p.add_argument("--no_ssh_check", action="store_true", help="no separate ssh check (ds makes none)")
    p.add_argument("--force_multi", action="store_true", help="use the multi-host launcher for one host")
    p.add_argument(
        "--save_pid", action="store_true", help="write this launcher's pid to /tmp/<pid>.deepspeed"
    )
    p.add_argument("--enable_each_rank_log", default="None", type=str, help="not available in ds")
    p.add_argument("--autotuning", default="", choices=["tune", "run"], type=str, help="not available in ds")
    p.add_argument("user_script", type=str, help="the training script, followed by its arguments")
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    p.add_argument(
        "--bind_cores_to_rank",
        action="store_true",
        help="each rank on its share of the host's cores (taskset)",
    )
    p.add_argument("--bind_core_list", type=str, default=None, help="the cores to share out, e.g. 1,3-5,7")
    p.add_argument("--ssh_port", type=int, default=None, help="the ssh port of every host")
    p.add_argument("--venv_script", type=str, default=None, help="a script each host sources first")
    p.add_argument(
        "--log_level",
        type=str,
        default="info",
        choices=["debug", "info", "warning", "error", "critical"],
        help="the runner's log level",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="--log_level error")
    return p.parse_args(args=args)


def fetch_hostfile(hostfile_path: str) -> collections.OrderedDict[str, int] | None:
    """``{host: slots}`` from the hostfile, or None (with DeepSpeed's warning) when there is none."""
    if not os.path.isfile(hostfile_path):
        logger.warning("Unable to find hostfile, will proceed with training with local resources only.")
        return None
    with open(hostfile_path) as fd:
        return _parse_hostfile(fd.readlines())


def _parse_hostfile(hostfile_lines: Iterable[str]) -> collections.OrderedDict[str, int]:
    """DeepSpeed's hostfile rules (ds-launch's parser: the error adds the line number)."""
    return collections.OrderedDict(ds_launch.parse_hostfile_lines(hostfile_lines))


def _stable_remove_duplicates(data: Iterable) -> list:
    return list(dict.fromkeys(data))


def parse_node_config(node_config: str) -> tuple[str, list[int]]:
    """``"host:0,2"`` -> ``("host", [0, 2])``; a bare host -> ``("host", [])``."""
    ((hostname, slots),) = ds_launch.parse_node_specs(node_config)
    return hostname, slots or []


def parse_node_config_list(node_config_list: str) -> dict[str, list[int]]:
    """``"a:0@b@a:1"`` -> ``{"a": [0, 1], "b": []}`` (slots merged, sorted, unique)."""
    merged: dict[str, list[int]] = collections.defaultdict(list)
    for hostname, slots in ds_launch.parse_node_specs(node_config_list):
        merged[hostname] += slots or []
    return {host: sorted(set(slots)) for host, slots in merged.items()}


def parse_resource_filter(
    host_info: Mapping[str, list[int]], include_str: str = "", exclude_str: str = ""
) -> collections.OrderedDict[str, list[int]]:
    """Apply ``--include``/``--exclude`` to ``{host: [slots]}`` (ds-launch's filter; hostfile order kept)."""
    return collections.OrderedDict(ds_launch.filter_resources(dict(host_info), include_str, exclude_str))


def parse_inclusion_exclusion(
    resource_pool: Mapping[str, int], inclusion: str, exclusion: str
) -> collections.OrderedDict[str, list[int]]:
    """``{host: slot count}`` -> the active ``{host: [slots]}`` after include/exclude."""
    active = {host: list(range(slots)) for host, slots in resource_pool.items()}
    return parse_resource_filter(active, include_str=inclusion, exclude_str=exclusion)


def apply_num_nodes_and_gpus(
    active_resources: Mapping[str, list[int]], num_nodes: int, num_gpus: int
) -> collections.OrderedDict[str, list[int]]:
    """The first ``num_nodes`` hosts, slots ``[0, num_gpus)`` on each (ds-launch's rule: asking for more
    hosts than there are is an error, where DeepSpeed quietly uses fewer)."""
    return collections.OrderedDict(ds_launch.limit_resources(dict(active_resources), num_nodes, num_gpus))


def encode_world_info(world_info: Mapping[str, list[int] | int]) -> str:
    """``{host: [slots]}`` as URL-safe base64 JSON, as every node's launcher receives it (a ``{host: count}``,
    as DeepSpeed's tests pass, is encoded as given, as DeepSpeed does)."""
    return base64.urlsafe_b64encode(
        json.dumps({h: s if isinstance(s, int) else list(s) for h, s in world_info.items()}).encode()
    ).decode()


def _refuse_unavailable(args: argparse.Namespace) -> None:
    defaults = {"autotuning": "", "enable_each_rank_log": "None"}
    for option, feature in UNAVAILABLE_OPTIONS.items():
        value = getattr(args, option)
        if value not in (defaults.get(option), None):
            raise FeatureNotAvailableError(
                f"deepspeed {'--' + option}: {feature} is not available in ds (DeepSpeed has it, ds does not); "
                "run without it"
            )


def _active_resources(args: argparse.Namespace) -> tuple[dict[str, list[int]], bool]:
    """The hosts and slots the job runs on, and whether a hostfile gave them (DeepSpeed's order of checks)."""
    if (args.num_nodes >= 0 or args.num_gpus >= 0) and (args.include != "" or args.exclude != ""):
        raise ValueError("Cannot specify num_nodes/gpus with include/exclude")
    pool = fetch_hostfile(args.hostfile)
    if not pool:
        if args.num_nodes > 1:
            raise ValueError("Num nodes is >1 but no extra nodes available via hostfile")
        pool = {"localhost": max(1, args.num_gpus)}
    active = parse_inclusion_exclusion(pool, args.include, args.exclude)
    return apply_num_nodes_and_gpus(active, args.num_nodes, args.num_gpus), pool is not None


def main(args: Sequence[str] | None = None) -> None:
    """The ``deepspeed`` command: run the job through ds-launch and exit with its code (non-zero unless every
    rank on every host exited 0)."""
    parsed = parse_args(args)
    _refuse_unavailable(parsed)
    explicit_port = _gave_master_port(_argv(args), parsed.user_script)
    active, _ = _active_resources(parsed)
    multi_node = (parsed.force_multi or len(active) > 1) and not parsed.no_ssh
    pid_file = Path(f"/tmp/{os.getpid()}.deepspeed") if parsed.save_pid else None
    if pid_file is not None:
        pid_file.write_text(str(os.getpid()))  # ds-launch runs in this process
    try:
        if multi_node:
            launcher = parsed.launcher.lower()
            runner_cls = LAUNCHER_CLASSES.get(launcher)
            if runner_cls is None:
                raise NotImplementedError(f"Unknown launcher {parsed.launcher}")
            runner_cls.validate_active_resources(active)
            world_info = encode_world_info(active)
            if runner_cls is PDSHRunner:  # DeepSpeed's signatures: pdsh needs no resource pool
                runner = runner_cls(parsed, world_info)
            else:
                runner = runner_cls(parsed, world_info, dict(fetch_hostfile(parsed.hostfile) or {}))
            if not runner.backend_exists():
                raise RuntimeError(f"launcher '{launcher}' not installed.")
            cmd = runner.get_cmd(dict(os.environ), active)
            cmd = cmd[0] if isinstance(cmd, tuple) else cmd  # PDSHRunner's is (cmd, kill_cmd, env)
        else:
            cmd = ds_launch_argv(parsed, active, "local", explicit_port=explicit_port)
        logger.info(f"cmd = {shlex.join(cmd)}")
        code = _run_ds_launch(cmd[3:])  # cmd = [python, -m, ds_launch.cli, ...]: run it in this process
    finally:
        if pid_file is not None:
            pid_file.unlink(missing_ok=True)
    if code:
        sys.exit(code)


def _argv(args: Sequence[str] | None) -> list[str]:
    return list(sys.argv[1:] if args is None else args)


def _gave_master_port(argv: list[str], user_script: str) -> bool:
    """Whether --master_port came before the script (after it, it is the script's own)."""
    before = argv[: argv.index(user_script)] if user_script in argv else argv
    return any(a == "--master_port" or a.startswith("--master_port=") for a in before)


if __name__ == "__main__":
    main()


run_autotuning = _missing_function(
    "deepspeed.launcher.runner",
    "run_autotuning",
    "DeepSpeed's autotuner (--autotuning)",
    "Set the config's batch sizes and ZeRO keys yourself.",
)

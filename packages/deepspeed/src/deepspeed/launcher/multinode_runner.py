"""DeepSpeed's ``deepspeed.launcher.multinode_runner``: the multi-host backends, as ds runs them.

Each runner's ``get_cmd`` returns the command ds actually runs: a ds-launch command line
(``python -m ds_launch.cli --launcher pdsh|ssh|mpi ...``), which starts a node launcher on every host over
pdsh or ssh, or mpirun, and supervises them (a host that fails ends the job non-zero, naming it).
``PDSHRunner`` uses pdsh when it is installed and plain ssh otherwise. The mpich, impi, slurm and mvapich
backends are not in ds: constructing one raises ``FeatureNotAvailableError``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ds_engine import FeatureNotAvailableError
from ds_launch._mpirun import MpirunNotFound, find_mpirun
from ds_launch._ssh import SSH_DEFAULT

__all__ = [
    "MultiNodeRunner",
    "PDSHRunner",
    "OpenMPIRunner",
    "MPICHRunner",
    "IMPIRunner",
    "SlurmRunner",
    "MVAPICHRunner",
    "ds_launch_argv",
]

_DEFAULT_HOSTFILE = "/job/hostfile"


def ds_launch_argv(
    args: argparse.Namespace,
    active: Mapping[str, Sequence[int]],
    launcher: str,
    exports: Mapping[str, str] | None = None,
    explicit_port: bool = True,
) -> list[str]:
    """The ds-launch command line for the ``deepspeed`` command's parsed ``args``."""
    argv = [sys.executable, "-m", "ds_launch.cli", "--launcher", launcher]
    if args.hostfile != _DEFAULT_HOSTFILE:
        argv += ["-H", args.hostfile]  # the default is read by ds-launch too, when it exists
    for flag, value in (("-i", args.include), ("-e", args.exclude)):
        if value:
            argv += [flag, value]
    if args.num_nodes > 0:
        argv += ["--num_nodes", str(args.num_nodes)]
    if args.num_gpus > 0:
        argv += ["--num_procs", str(args.num_gpus)]
    if args.master_addr:
        argv += ["--master_addr", args.master_addr]
    if explicit_port or launcher != "local":  # one host: a free port unless one is asked for
        argv += ["--master_port", str(args.master_port)]
    if args.launcher_args:
        argv.append(f"--launcher_args={args.launcher_args}")
    if getattr(args, "ssh_port", None) is not None:
        argv += ["--ssh_cmd", " ".join([*SSH_DEFAULT, "-p", str(args.ssh_port)])]
    if getattr(args, "venv_script", None):
        argv += ["--venv_script", args.venv_script]
    for key, value in (exports or {}).items():
        argv.append(f"--export={key}={value}")
    if getattr(args, "no_ssh", False):
        from ds_launch import encode_world_info

        argv += [f"--world_info={encode_world_info(active)}", f"--node_rank={args.node_rank}"]
    for flag in ("module", "no_python", "no_local_rank", "bind_cores_to_rank"):
        if getattr(args, flag, False):
            argv.append(f"--{flag}")
    if getattr(args, "bind_core_list", None):
        argv.append(f"--bind_core_list={args.bind_core_list}")
    return [*argv, args.user_script, *args.user_args]


class MultiNodeRunner(ABC):
    """A multi-host backend: ``get_cmd`` builds the command that starts every host's ranks."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str) -> None:
        self.args = args
        self.validate_args()
        self.user_arguments = self.parse_user_args()
        self.user_script = args.user_script
        self.world_info_base64 = world_info_base64
        self.exports: dict[str, str] = {}

    @abstractmethod
    def backend_exists(self) -> Any:
        """Whether the backend's program is installed."""

    @abstractmethod
    def get_cmd(self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]) -> Any:
        """The command that runs the job."""

    def add_export(self, key: str, var: str) -> None:
        """A variable every rank gets (quoted as DeepSpeed quotes it for a remote shell)."""
        var = var.strip()
        if re.search(r"[^\w@%+=:,./-]", var):
            var = f'"{var}"'
        self.exports[key.strip()] = var

    def parse_user_args(self) -> list[str]:
        return self.args.user_args

    @property
    def name(self) -> str:
        return self.__class__.__name__

    def validate_args(self) -> None:  # noqa: B027 - a hook, empty by default (as in DeepSpeed)
        """Refuse options the backend cannot honour."""

    @classmethod  # noqa: B027 - a hook, empty by default (as in DeepSpeed)
    def validate_active_resources(cls, active_resources: Mapping[str, Sequence[int]]) -> None:
        """Refuse an include/exclude result the backend cannot express (before one host goes local)."""

    def _unquoted_exports(self) -> dict[str, str]:
        # ds-launch quotes every value itself (never through a shell it did not quote for)
        return {k: v[1:-1] if len(v) > 1 and v[0] == v[-1] == '"' else v for k, v in self.exports.items()}


class PDSHRunner(MultiNodeRunner):
    """pdsh when installed, else plain ssh (one ssh per host): ds-launch's pdsh or ssh launcher."""

    def backend_exists(self) -> Any:
        return shutil.which("pdsh") or shutil.which(SSH_DEFAULT[0])

    @property
    def name(self) -> str:
        return "pdsh"

    def get_cmd(
        self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]
    ) -> tuple[list[str], list[str], dict[str, str]]:
        """``(command, kill_command, environment)`` as DeepSpeed returns them; the kill command is empty:
        each host's node launcher stops its ranks when its remote shell ends, so stopping ds-launch is enough."""
        launcher = "pdsh" if shutil.which("pdsh") else "ssh"
        cmd = ds_launch_argv(self.args, active_resources, launcher, self._unquoted_exports())
        return cmd, [], environment


class OpenMPIRunner(MultiNodeRunner):
    """mpirun: ds-launch's mpi launcher (ranks find their place through mpi4py)."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str, resource_pool: Mapping[str, int]):
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool
        self.add_export("UCX_TLS", "tcp")

    def backend_exists(self) -> Any:
        try:
            return find_mpirun()
        except MpirunNotFound:
            return None

    @property
    def name(self) -> str:
        return "openmpi"

    def validate_args(self) -> None:
        if self.args.include != "" or self.args.exclude != "":
            raise ValueError(f"{self.name} backend does not support worker include/exclusion")
        if self.args.num_nodes != -1 or self.args.num_gpus != -1:
            raise ValueError(f"{self.name} backend does not support limiting num nodes/gpus")

    def get_cmd(
        self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]
    ) -> list[str]:
        return ds_launch_argv(self.args, active_resources, "mpi", self._unquoted_exports())


class _Unavailable(MultiNodeRunner):
    """A DeepSpeed backend ds does not have: constructing it names it."""

    launcher = ""

    def __init__(self, args: argparse.Namespace, world_info_base64: str, resource_pool: Any = None):
        raise FeatureNotAvailableError(
            f"deepspeed --launcher {self.launcher}: the {self.launcher} launcher is not available in ds "
            "(DeepSpeed has it, ds does not); use --launcher pdsh (pdsh or ssh) or --launcher openmpi"
        )

    def backend_exists(self) -> Any:
        return None

    def get_cmd(self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]) -> Any:
        raise AssertionError("unreachable: construction fails")


class MPICHRunner(_Unavailable):
    launcher = "mpich"


class IMPIRunner(_Unavailable):
    launcher = "impi"


class SlurmRunner(_Unavailable):
    launcher = "slurm"


class MVAPICHRunner(_Unavailable):
    launcher = "mvapich"

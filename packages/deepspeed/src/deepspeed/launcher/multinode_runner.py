"""DeepSpeed's ``deepspeed.launcher.multinode_runner``: the multi-host backends, as ds runs them.

Each runner's ``get_cmd`` returns the command ds actually runs: a ds-launch command line
(``python -m ds_launch.cli --launcher pdsh|ssh|mpi|mpich|slurm --resources=<the hosts> ...``), which starts a
node launcher on every host over pdsh or ssh, or runs mpirun or srun, and supervises them (a host that fails ends the job
non-zero, naming it). The hosts and slots are the ``active_resources`` given to ``get_cmd``
(``{host: [slots]}``, or ``{host: count}`` as DeepSpeed's tests pass them). What a user relies on is DeepSpeed's:
the hosts and process counts, ``--launcher_args`` placed where DeepSpeed places them, the NIC options
(``OpenMPIRunner`` adds DeepSpeed's ``--mca btl ^openib`` and ``--mca btl_tcp_if_include eth0`` unless
``--launcher_args`` names ``btl_tcp_if_include``), the exports (``UCX_TLS=tcp``; MVAPICH's ``MV2_*``) and
``PDSH_RCMD_TYPE=ssh`` in the returned environment. ``PDSHRunner`` uses pdsh when it is installed and plain ssh
otherwise; ``MPICHRunner`` and ``MVAPICHRunner`` run ds-launch's mpich launcher (Hydra's ``mpirun -n -ppn
-hosts -genv``); ``SlurmRunner`` its slurm launcher (``srun``). The impi backend is not in ds: constructing one raises
``FeatureNotAvailableError``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ds_engine import FeatureNotAvailableError
from ds_launch._mpirun import MpirunNotFound, find_hydra_mpirun, find_mpirun
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
    hosts: Mapping[str, Sequence[int] | int] | None = None,
    launcher_args: str | None = None,
) -> list[str]:
    """The ds-launch command line for the ``deepspeed`` command's parsed ``args``; ``hosts`` (the runners'
    active resources) replace the hostfile and its selection options, ``launcher_args`` the user's."""
    argv = [sys.executable, "-m", "ds_launch.cli", "--launcher", launcher]
    if hosts is not None:
        from ds_launch import encode_world_info

        argv.append(f"--resources={encode_world_info(slot_lists(hosts))}")
    else:
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
    launcher_args = args.launcher_args if launcher_args is None else launcher_args
    if launcher_args:
        argv.append(f"--launcher_args={launcher_args}")
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


def slot_lists(hosts: Mapping[str, Sequence[int] | int]) -> dict[str, list[int]]:
    """``{host: [slots]}`` from ``{host: [slots]}`` or ``{host: count}`` (slots ``0..count-1``)."""
    return {h: list(range(s)) if isinstance(s, int) else list(s) for h, s in hosts.items()}


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
        environment["PDSH_RCMD_TYPE"] = "ssh"  # as DeepSpeed sets it (ds-launch: pdsh -R exec ssh)
        cmd = ds_launch_argv(
            self.args, active_resources, launcher, self._unquoted_exports(), hosts=active_resources
        )
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
        _whole_hosts_only(self.args, self.name)

    def get_cmd(
        self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]
    ) -> list[str]:
        """ds-launch's mpi launcher: ``mpirun -n N -H h1:n1,... --mca btl ^openib --mca btl_tcp_if_include eth0
        <launcher_args> -x UCX_TLS=tcp ...`` (DeepSpeed's NIC defaults; ``btl_tcp_if_include`` in
        ``--launcher_args`` replaces the eth0 one)."""
        nic = ["--mca", "btl", "^openib"]
        if "btl_tcp_if_include" not in self.args.launcher_args:
            nic += ["--mca", "btl_tcp_if_include", "eth0"]
        launcher_args = shlex.join(nic) + (f" {self.args.launcher_args}" if self.args.launcher_args else "")
        return ds_launch_argv(
            self.args, active_resources, "mpi", self._unquoted_exports(), hosts=active_resources,
            launcher_args=launcher_args,
        )  # fmt: skip


def _whole_hosts_only(args: argparse.Namespace, name: str) -> None:
    if args.include != "" or args.exclude != "":
        raise ValueError(f"{name} backend does not support worker include/exclusion")
    if args.num_nodes != -1 or args.num_gpus != -1:
        raise ValueError(f"{name} backend does not support limiting num nodes/gpus")


class MPICHRunner(MultiNodeRunner):
    """mpirun of MPICH (Hydra): ds-launch's mpich launcher, ``mpirun -n N -ppn P -hosts h1,h2 <launcher_args>
    -genv K V ...``; every host runs the same number of ranks (as DeepSpeed requires)."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str, resource_pool: Mapping[str, int]):
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool

    def backend_exists(self) -> Any:
        """MPICH's mpirun (``mpirun.mpich`` beside Open MPI's ``mpirun`` on Debian; a plain ``mpirun`` only when it
        is Hydra's)."""
        try:
            return find_hydra_mpirun()
        except MpirunNotFound:
            return None

    @property
    def name(self) -> str:
        return "mpich"

    def validate_args(self) -> None:
        _whole_hosts_only(self.args, self.name)

    def get_cmd(
        self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]
    ) -> list[str]:
        counts = {len(slots) for slots in slot_lists(active_resources).values()}
        if len(counts) > 1:
            raise ValueError("MPICH requires same number of devices per node")
        return ds_launch_argv(
            self.args, active_resources, "mpich", self._unquoted_exports(), hosts=active_resources
        )


class MVAPICHRunner(MPICHRunner):
    """MVAPICH's mpirun (Hydra's syntax, as ds-launch's mpich launcher writes it), with DeepSpeed's ``MV2_*``
    exports."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str, resource_pool: Mapping[str, int]):
        super().__init__(args, world_info_base64, resource_pool)
        for key, value in _MV2_EXPORTS.items():
            self.add_export(key, value)
        from deepspeed.accelerator.real_accelerator import get_accelerator

        if get_accelerator().device_name() == "cuda":
            self.add_export("MV2_USE_CUDA", "1")  # CUDA-aware MVAPICH, as DeepSpeed asks for

    def backend_exists(self) -> Any:
        """MVAPICH2-GDR, as DeepSpeed checks it (``mpiname`` names it)."""
        if shutil.which("mpiname") is None:
            return False
        return "MVAPICH2-GDR" in subprocess.run(["mpiname"], capture_output=True, text=True).stdout

    @property
    def name(self) -> str:
        return "mvapich"


# DeepSpeed's MVAPICH settings: no CMA (absent on Ubuntu), backtraces on failure, deep-learning support, no
# affinity (MPI_THREAD_MULTIPLE), its allgather tuning
_MV2_EXPORTS = {
    "MV2_SMP_USE_CMA": "0",
    "MV2_DEBUG_SHOW_BACKTRACE": "1",
    "MV2_SUPPORT_DL": "1",
    "MV2_ENABLE_AFFINITY": "0",
    "MV2_INTER_ALLGATHER_TUNING": "5",
    "MV2_CUDA_USE_NAIVE": "0",
}


class _Unavailable(MultiNodeRunner):
    """A DeepSpeed backend ds does not have: constructing it names it (``__ds_missing__``: the surface check
    counts it as not available)."""

    launcher = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__ds_missing__ = f"the {cls.launcher} launcher"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise FeatureNotAvailableError(
            f"deepspeed --launcher {self.launcher}: the {self.launcher} launcher is not available in ds "
            "(DeepSpeed has it, ds does not); use --launcher pdsh (pdsh or ssh), openmpi, mpich, mvapich or slurm"
        )

    def backend_exists(self) -> Any:
        return None

    def get_cmd(self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]) -> Any:
        raise AssertionError("unreachable: construction fails")


class IMPIRunner(_Unavailable):
    launcher = "impi"


class SlurmRunner(MultiNodeRunner):
    """srun: ds-launch's slurm launcher (each task finds its rank from Slurm's variables)."""

    def __init__(self, args: argparse.Namespace, world_info_base64: str, resource_pool: Mapping[str, int]):
        super().__init__(args, world_info_base64)
        self.resource_pool = resource_pool

    def backend_exists(self) -> Any:
        return shutil.which("sinfo")  # DeepSpeed's test for a Slurm cluster

    @property
    def name(self) -> str:
        return "slurm"

    @classmethod
    def validate_active_resources(cls, active_resources: Mapping[str, Sequence[int]]) -> None:
        """srun places ranks by count: the first N slots of every host, the same N everywhere (as DeepSpeed)."""
        for hostname, slots in active_resources.items():
            if list(slots) != list(range(len(slots))):
                raise ValueError(
                    f"slurm backend cannot select specific device ids, got {list(slots)} on {hostname}. "
                    "Filter whole hosts, or keep the first N slots on every host."
                )
        counts = {hostname: len(slots) for hostname, slots in active_resources.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(f"slurm backend needs the same slot count on every host, got {counts}.")

    def get_cmd(
        self, environment: dict[str, str], active_resources: Mapping[str, Sequence[int]]
    ) -> list[str]:
        return ds_launch_argv(
            self.args, active_resources, "slurm", self._unquoted_exports(), hosts=active_resources
        )

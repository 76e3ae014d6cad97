"""Build the ``mpirun`` command that starts every rank on every host of the selection."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._hostfile import HostfileError
from ._mpi_discovery import MPI_INSTALL_HINT

__all__ = ["MpirunNotFound", "find_mpirun", "build_mpirun_command", "build_hydra_command"]


class MpirunNotFound(RuntimeError):
    """No ``mpirun`` next to this Python or on PATH."""


def find_mpirun() -> str:
    """``mpirun`` from this Python's environment first (it matches the mpi4py installed there), then PATH."""
    beside_python = Path(sys.executable).parent / "mpirun"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("mpirun")
    if found is None:
        raise MpirunNotFound(
            f"launcher 'mpi' needs mpirun, which is not installed. Install it with: {MPI_INSTALL_HINT}"
        )
    return found


def _leading_slots(active: Mapping[str, Sequence[int]]) -> None:
    for host, slots in active.items():
        if list(slots) != list(range(len(slots))):
            # mpirun places ranks by count; it cannot give each host its own CUDA_VISIBLE_DEVICES.
            raise HostfileError(
                f"The mpi launcher runs a number of ranks per host and cannot pin them to slots {list(slots)} "
                f"on host '{host}'; select whole hosts or leading slots ('{host}:0,1,...'), or use "
                "--launcher local on a single host"
            )


def _hosts_argument(active: Mapping[str, Sequence[int]]) -> str:
    _leading_slots(active)
    return ",".join(f"{host}:{len(slots)}" for host, slots in active.items())


def build_mpirun_command(
    mpirun: str,
    active: Mapping[str, Sequence[int]],
    program: Sequence[str],
    exports: Mapping[str, str],
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """``mpirun -n TOTAL -H h1:n1,h2:n2 <launcher_args> -x K=V ... <program>`` as an argument list.

    No transport or network-interface flags are added: those belong to the cluster and come
    through ``launcher_args``. Ranks find their place through mpi4py (``init_distributed``), so no
    ``--local_rank`` argument is passed, as with DeepSpeed's openmpi launcher.
    """
    total = sum(len(slots) for slots in active.values())
    cmd = [mpirun, "-n", str(total), "-H", _hosts_argument(active), *launcher_args]
    for key, value in exports.items():
        cmd += ["-x", f"{key}={value}"]
    return cmd + list(program)


def build_hydra_command(
    mpirun: str,
    active: Mapping[str, Sequence[int]],
    program: Sequence[str],
    exports: Mapping[str, str],
    launcher_args: Sequence[str] = (),
) -> list[str]:
    """MPICH's (Hydra's) syntax, which MVAPICH's mpirun shares:
    ``mpirun -n TOTAL -ppn PER_HOST -hosts h1,h2 <launcher_args> -genv K V ... <program>``.

    ``-ppn`` gives every host the same number of ranks, so the hosts must have equal slot counts (as
    DeepSpeed's mpich launcher requires)."""
    _leading_slots(active)
    counts = {host: len(slots) for host, slots in active.items()}
    if len(set(counts.values())) > 1:
        raise HostfileError(
            f"The mpich launcher runs the same number of ranks on every host (-ppn), but the hosts have {counts}; "
            "select the same number of slots on each (--num_gpus N) or use --launcher mpi or ssh"
        )
    total, per_host = sum(counts.values()), next(iter(counts.values()))
    cmd = [mpirun, "-n", str(total), "-ppn", str(per_host), "-hosts", ",".join(counts), *launcher_args]
    for key, value in exports.items():
        cmd += ["-genv", key, value]
    return cmd + list(program)

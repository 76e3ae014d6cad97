"""Build the ``mpirun`` command that starts every rank on every host of the selection."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._hostfile import HostfileError
from ._mpi_discovery import MPI_INSTALL_HINT

__all__ = [
    "MpirunNotFound",
    "find_mpirun",
    "find_hydra_mpirun",
    "build_mpirun_command",
    "build_hydra_command",
]

# MPICH's own names for its Hydra mpirun (Debian installs them beside Open MPI's, whose `mpirun` stays the default)
HYDRA_NAMES = ("mpirun.mpich", "mpiexec.mpich", "mpiexec.hydra")
MPICH_INSTALL_HINT = "apt-get install mpich (Debian/Ubuntu), or pip install mpich"


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


def _says_hydra(path: str) -> bool:
    """True when ``path --version`` names Hydra (MPICH's, MVAPICH's, Intel MPI's process manager)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in (out.stdout + out.stderr).upper()


def find_hydra_mpirun() -> str:
    """MPICH's (Hydra's) mpirun, for the mpich launcher: this Python's environment first, then PATH; in each,
    MPICH's own names (``mpirun.mpich``, ``mpiexec.mpich``, ``mpiexec.hydra``) before a plain ``mpirun`` or
    ``mpiexec``, which counts only when its ``--version`` says Hydra (on a machine with both, ``mpirun`` is
    usually Open MPI's)."""
    seen = []
    for where in (str(Path(sys.executable).parent), None):  # None: PATH
        for name in HYDRA_NAMES:
            if found := shutil.which(name, path=where):
                return found
        for name in ("mpirun", "mpiexec"):
            found = shutil.which(name, path=where)
            if found and found not in seen:
                seen.append(found)
                if _says_hydra(found):
                    return found
    others = f" ({', '.join(seen)} {'is' if len(seen) == 1 else 'are'} not Hydra's)" if seen else ""
    raise MpirunNotFound(
        f"launcher 'mpich' needs MPICH's mpirun (Hydra: {', '.join(HYDRA_NAMES)}), which is not installed{others}. "
        f"Install it with: {MPICH_INSTALL_HINT}"
    )


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

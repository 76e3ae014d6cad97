"""Ranks from mpi4py's COMM_WORLD, imported only when a script really runs under an MPI launcher."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._discovery import Discovered

__all__ = ["MPI_INSTALL_HINT", "MPIWorld", "import_mpi", "mpi_world"]

MPI_INSTALL_HINT = "pip install 'ds-launch[mpi]'"


@dataclass(frozen=True)
class MPIWorld(Discovered):
    """Discovered ranks plus every rank's host name (index = rank)."""

    hostnames: tuple[str, ...] = ()


def import_mpi() -> Any:
    """``mpi4py.MPI``, or an ImportError carrying the exact install command."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ImportError(
            f"Rank discovery under mpirun needs mpi4py, which is not installed ({exc}). Install it with: "
            f"{MPI_INSTALL_HINT}"
        ) from exc
    return MPI


def mpi_world() -> tuple[Any, MPIWorld]:
    """COMM_WORLD and this rank's place in it; the local rank counts lower ranks on the same host.

    Host identity is ``MPI.Get_processor_name()``, as DeepSpeed's mpi_discovery uses, so the answer
    does not depend on which variables a particular MPI implementation exports.
    """
    MPI = import_mpi()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    names: list[str] = comm.allgather(MPI.Get_processor_name())
    local_rank, local_world_size = names[:rank].count(names[rank]), names.count(names[rank])
    return comm, MPIWorld(rank, size, local_rank, local_world_size, "mpi4py", tuple(names))

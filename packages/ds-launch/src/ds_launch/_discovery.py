"""Where a process learns its rank: launcher environment variables, MPI runtimes, SLURM.

Pure functions over an environment mapping, so every launcher's variables can be tested without the
launcher. mpi4py-based discovery lives in ``_mpi_discovery.py``; this module never imports MPI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Discovered", "LaunchEnvError", "discover_from_env", "mpi_runtime", "parse_slurm_tasks_per_node"]


class LaunchEnvError(RuntimeError):
    """The launch environment is inconsistent or incomplete; the message says which variable to set."""


@dataclass(frozen=True)
class Discovered:
    """Ranks as read from one launcher's variables; ``None`` where that launcher does not say."""

    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    source: str  # "env:RANK" | "env:OMPI" | "env:PMI" | "slurm"


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise LaunchEnvError(f"Environment variable {name}={value!r} is not an integer") from None


def _opt_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        if name in env:
            return _int(env, name)
    return None


def mpi_runtime(env: Mapping[str, str]) -> str | None:
    """The MPI runtime that started this process ("OMPI", "PMI", "PMIX"), or ``None``."""
    if "OMPI_COMM_WORLD_SIZE" in env:
        return "OMPI"
    if "PMI_SIZE" in env:
        return "PMI"
    if "PMIX_RANK" in env:
        return "PMIX"
    return None


_SLURM_GROUP = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def parse_slurm_tasks_per_node(value: str, node_id: int) -> int:
    """Tasks on node ``node_id`` from SLURM's compressed list, e.g. ``"2(x3),1"`` = 2,2,2,1."""
    counts: list[int] = []
    for group in value.split(","):
        match = _SLURM_GROUP.match(group.strip())
        if match is None:
            raise LaunchEnvError(f"Cannot read SLURM tasks-per-node list {value!r} (group {group!r})")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if not 0 <= node_id < len(counts):
        raise LaunchEnvError(f"SLURM_NODEID={node_id} is outside the tasks-per-node list {value!r}")
    return counts[node_id]


def _from_slurm(env: Mapping[str, str]) -> Discovered:
    local_world_size = None
    if "SLURM_STEP_TASKS_PER_NODE" in env and "SLURM_NODEID" in env:
        local_world_size = parse_slurm_tasks_per_node(
            env["SLURM_STEP_TASKS_PER_NODE"], _int(env, "SLURM_NODEID")
        )
    return Discovered(
        rank=_int(env, "SLURM_PROCID"),
        world_size=_int(env, "SLURM_STEP_NUM_TASKS"),
        local_rank=_opt_int(env, "SLURM_LOCALID"),
        local_world_size=local_world_size,
        source="slurm",
    )


def discover_from_env(env: Mapping[str, str]) -> Discovered | None:
    """Ranks from the first launcher whose variables are present, in this order of trust.

    torchrun/ds-launch (RANK, WORLD_SIZE) win because they are set deliberately for this process;
    then Open MPI, MPICH/Intel MPI (PMI), and a SLURM ``srun`` step. ``SLURM_STEP_NUM_TASKS`` is used
    rather than ``SLURM_NTASKS`` because only ``srun`` sets it: a batch script started by sbatch
    sees the allocation's task count although it runs as a single process.
    """
    if "RANK" in env and "WORLD_SIZE" in env:
        found = Discovered(
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_opt_int(env, "LOCAL_RANK"),
            local_world_size=_opt_int(env, "LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
            source="env:RANK",
        )
    elif "OMPI_COMM_WORLD_SIZE" in env and "OMPI_COMM_WORLD_RANK" in env:
        found = Discovered(
            rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE"),
            local_rank=_opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            local_world_size=_opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            source="env:OMPI",
        )
    elif "PMI_SIZE" in env and "PMI_RANK" in env:
        found = Discovered(
            rank=_int(env, "PMI_RANK"),
            world_size=_int(env, "PMI_SIZE"),
            local_rank=_opt_int(env, "MPI_LOCALRANKID"),
            local_world_size=_opt_int(env, "MPI_LOCALNRANKS"),
            source="env:PMI",
        )
    elif "SLURM_PROCID" in env and "SLURM_STEP_NUM_TASKS" in env:
        found = _from_slurm(env)
    else:
        return None
    _check(found)
    return found


def _check(found: Discovered) -> None:
    if found.world_size < 1 or not 0 <= found.rank < found.world_size:
        raise LaunchEnvError(
            f"Inconsistent ranks from {found.source}: rank {found.rank} with world size {found.world_size}"
        )
    if found.local_rank is not None and found.local_world_size is not None:
        if not 0 <= found.local_rank < found.local_world_size:
            raise LaunchEnvError(
                f"Inconsistent local ranks from {found.source}: local rank {found.local_rank} with local "
                f"world size {found.local_world_size}"
            )

"""Rank discovery from each launcher's environment variables (no processes needed)."""

from __future__ import annotations

import pytest
from ds_launch._discovery import LaunchEnvError, discover_from_env, mpi_runtime, parse_slurm_tasks_per_node

CASES = [
    ({}, None),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (3, 8, 1, 2, "env:RANK")),
    ({"RANK": "0", "WORLD_SIZE": "2"}, (0, 2, None, None, "env:RANK")),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2"}, (1, 4, 1, 2, "env:RANK")),
    (
        {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "6",
            "OMPI_COMM_WORLD_LOCAL_RANK": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
        },
        (5, 6, 2, 3, "env:OMPI"),
    ),
    (
        {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
        (1, 2, 1, 2, "env:PMI"),
    ),
    (
        {
            "SLURM_PROCID": "4",
            "SLURM_STEP_NUM_TASKS": "6",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
        },
        (4, 6, 0, 2, "slurm"),
    ),
    # An sbatch script (no srun step) is one process even though the allocation has many tasks.
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, None),
    # torchrun inside mpirun or srun: the variables set for this process win.
    (
        {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
        (1, 2, None, None, "env:RANK"),
    ),
]


@pytest.mark.parametrize(("env", "expected"), CASES)
def test_discover_from_env(env, expected):
    found = discover_from_env(env)
    if expected is None:
        assert found is None
    else:
        assert (
            found.rank,
            found.world_size,
            found.local_rank,
            found.local_world_size,
            found.source,
        ) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 with world size 2"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            "local rank 2 with local world",
        ),
    ],
)
def test_inconsistent_env_is_an_error(env, message):
    with pytest.raises(LaunchEnvError, match=message):
        discover_from_env(env)


@pytest.mark.parametrize(
    ("env", "runtime"),
    [
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI"),
        ({"PMI_SIZE": "2"}, "PMI"),
        ({"PMIX_RANK": "0"}, "PMIX"),
        ({"RANK": "0"}, None),
    ],
)
def test_mpi_runtime(env, runtime):
    assert mpi_runtime(env) == runtime


@pytest.mark.parametrize(
    ("value", "node", "tasks"), [("4", 0, 4), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("1,3", 1, 3)]
)
def test_slurm_tasks_per_node(value, node, tasks):
    assert parse_slurm_tasks_per_node(value, node) == tasks


def test_slurm_tasks_per_node_errors():
    with pytest.raises(LaunchEnvError, match="outside"):
        parse_slurm_tasks_per_node("2(x2)", 2)
    with pytest.raises(LaunchEnvError, match="Cannot read"):
        parse_slurm_tasks_per_node("2x2", 0)

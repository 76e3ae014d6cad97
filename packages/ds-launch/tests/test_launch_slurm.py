"""The slurm launcher's srun command and rank 0's address for a script srun started (no Slurm needed here;
integration/test_slurm.py runs them on a real Slurm across test hosts)."""

from __future__ import annotations

import pytest
from ds_launch._discovery import discover_from_env
from ds_launch._slurm import build_srun_command, expand_hostlist, slurm_master


def test_expand_hostlist():
    assert expand_hostlist("node[0-2,5],gpu01") == ["node0", "node1", "node2", "node5", "gpu01"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("solo") == ["solo"]


def test_srun_command_places_ranks_by_count():
    cmd = build_srun_command("srun", {"a": [0, 1], "b": [0, 1]}, ["python", "t.py"], ["--partition", "x"])
    assert cmd == ["srun", "-n", "4", "--nodes", "2", "--nodelist", "a,b", "--ntasks-per-node", "2",
                   "--partition", "x", "--export=ALL", "python", "t.py"]  # fmt: skip
    with pytest.raises(ValueError, match="same number of slots on every host"):
        build_srun_command("srun", {"a": [0, 1], "b": [0]}, ["t"], [])
    with pytest.raises(ValueError, match="cannot select slots"):
        build_srun_command("srun", {"a": [1]}, ["t"], [])


def test_a_srun_task_finds_rank_and_master_from_slurm_variables():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NODELIST": "node[0-1]", "SLURM_JOB_ID": "123457",
           "SLURM_STEP_ID": "2"}  # fmt: skip
    found = discover_from_env(env)
    assert (found.rank, found.world_size, found.local_rank, found.local_world_size) == (3, 4, 1, 2)
    assert slurm_master(env) == ("node0", 15000 + 3457 + 2)
    assert slurm_master({"SLURM_PROCID": "0"}) is None  # not a Slurm step: no guess

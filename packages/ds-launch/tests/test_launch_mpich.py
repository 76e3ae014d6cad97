"""MPICH's mpirun (Hydra): ds-launch's mpich launcher runs a real 2-rank job.

Each rank finds its place in Hydra's variables (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``,
``MPI_LOCALNRANKS``) and meets rank 0 at the ``MASTER_ADDR``/``MASTER_PORT`` the launcher exports, without
mpi4py (the one the ``mpi`` extra installs is built for Open MPI and sees a world of one under Hydra). Debian
installs MPICH beside Open MPI (``apt-get install mpich``; ``.ci/run`` does): MPICH's mpirun is then
``mpirun.mpich`` and ``mpirun`` stays Open MPI's. Skipped, saying so, where MPICH is not installed.
"""

from __future__ import annotations

import shlex

import pytest
from ds_launch._mpirun import MpirunNotFound, find_hydra_mpirun
from launch_procs import SCRIPTS, records, run_cli


def _hydra() -> str | None:
    try:
        return find_hydra_mpirun()
    except MpirunNotFound:
        return None


HYDRA = _hydra()
pytestmark = pytest.mark.skipif(
    HYDRA is None,
    reason="MPICH's mpirun (Hydra) is not installed: apt-get install mpich (or pip install mpich)",
)


def test_two_ranks_under_mpich_find_their_place_in_hydras_variables(tmp_path):
    args = ["--launcher", "mpich", "--num_gpus", "2", str(SCRIPTS / "allreduce_rank.py"), str(tmp_path)]
    res = run_cli(args, timeout_s=120)
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("ds-launch: running "))
    cmd = shlex.split(line.removeprefix("ds-launch: running "))
    assert cmd[:7] == [HYDRA, "-n", "2", "-ppn", "2", "-hosts", "localhost"]
    recs = records(tmp_path)
    assert sorted(recs) == [0, 1]
    assert [recs[r]["local_rank"] for r in (0, 1)] == [0, 1]
    assert {
        (r["world_size"], r["local_world_size"], r["source"], r["master_addr"], r["sum"], r["idempotent"])
        for r in recs.values()
    } == {(2, 2, "env:PMI", "127.0.0.1", 3.0, True)}

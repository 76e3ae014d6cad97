"""The real mpirun (Open MPI from PyPI): init_distributed under it, and ds-launch's mpi launcher."""

from __future__ import annotations

import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ds_launch._mpirun import find_mpirun
from launch_procs import SCRIPTS, mpi_env, records, run_cli, wait_no_survivors

pytest.importorskip("mpi4py")
pytestmark = pytest.mark.mpi

# Tests only: this machine has 2 cores, and its processes reach each other over loopback alone.
TEST_MPIRUN_ARGS = ["--oversubscribe"]


# a world of one, and several ranks (4: 2 would take the same path; each mpirun start costs CI seconds)
@pytest.mark.parametrize("n", [1, 4])
def test_ranks_under_mpirun_agree_and_all_reduce(tmp_path, n):
    cmd = [
        find_mpirun(),
        "-n",
        str(n),
        *TEST_MPIRUN_ARGS,
        sys.executable,
        str(SCRIPTS / "allreduce_rank.py"),
        str(tmp_path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=mpi_env())
    assert res.returncode == 0, res.stdout + res.stderr
    recs = records(tmp_path)
    assert sorted(recs) == list(range(n))
    # One host: local ranks are the global ranks, and everyone met at rank 0's store.
    assert [recs[r]["local_rank"] for r in range(n)] == list(range(n))
    assert {
        (r["world_size"], r["local_world_size"], r["master_addr"], r["master_port"], r["source"])
        for r in recs.values()
    } == {(n, n, "127.0.0.1", recs[0]["master_port"], "mpi4py")}
    assert all(
        r["sum"] == n * (n + 1) / 2 and r["idempotent"] and r["backend"] == "gloo" for r in recs.values()
    )


def test_two_hostnames_on_one_machine_via_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# one machine, two names\nlocalhost slots=2\n127.0.0.1 slots=2\n")
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli(
        [
            "--hostfile",
            str(hostfile),
            "--launcher_args",
            shlex.join(TEST_MPIRUN_ARGS),
            str(SCRIPTS / "mpi_rank.py"),
            str(out),
            "a b",
        ],
        timeout_s=120,
        env=mpi_env(),
    )
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("ds-launch: running "))
    cmd = shlex.split(line.removeprefix("ds-launch: running "))
    assert cmd[1:5] == ["-n", "4", "-H", "localhost:2,127.0.0.1:2"]
    assert cmd[5] == "--oversubscribe"
    # Through the line-buffered entry, not `python -u` (which writes a line's newline separately).
    assert Path(cmd[-4]).name == "_rank_entry.py" and "-u" not in cmd
    assert cmd[-3:] == [str(SCRIPTS / "mpi_rank.py"), str(out), "a b"]
    assert "--local_rank" not in line and "btl_tcp_if_include" not in line and "UCX_TLS" not in line
    assert any(a.startswith("PYTHONPATH=") for a in cmd)
    recs = records(out)
    assert sorted(recs) == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["argv"] == ["a b"] for r in recs.values())
    # Both names are this machine, so MPI reports one host and local ranks 0..3.
    assert sorted(r["local_rank"] for r in recs.values()) == [0, 1, 2, 3]


def test_failing_rank_under_mpi_launcher_ends_the_job(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    res = run_cli(
        [
            "--launcher",
            "mpi",
            "--num_procs",
            "2",
            "--grace",
            "1",
            "--launcher_args",
            shlex.join(TEST_MPIRUN_ARGS),
            str(SCRIPTS / "env_rank.py"),
            "--out",
            str(tmp_path),
            "--fail-rank",
            "1",
            "--code",
            "3",
            "--sleep",
            "60",
            marker,
        ],
        timeout_s=60,
        env=mpi_env(),
    )
    assert res.returncode != 0
    assert "mpirun exited with code" in res.stderr
    assert wait_no_survivors(marker) == []

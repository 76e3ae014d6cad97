"""A bad config fails a job with its message shown once, naming the ranks, without a traceback.

Real jobs: ds-launch's local and mpi launchers, torchrun and plain mpirun, two ranks each, loading one
config whose batch sizes do not add up (scripts/config_error_rank.py). A bug keeps its traceback.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from ds_config import ConfigError, ConfigProblem
from ds_launch._excepthook import config_error_text
from launch_procs import SCRIPTS, mpi_env, run_cli

SCRIPT = str(SCRIPTS / "config_error_rank.py")
PROBLEM = "train_batch_size = 10: train_batch_size is not equal to"
FULL = "1 problem in DeepSpeed config (dict):"
RANK1_LINE = "ConfigError on rank 1 in dict (rank 0 prints it in full if it failed the same way): " + PROBLEM


def _mpi_missing() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return True
    return shutil.which("mpirun") is None


def test_under_ds_launch_the_message_is_printed_once_naming_both_ranks():
    res = run_cli(["--num_procs", "2", "--no_local_rank", SCRIPT, "config"], timeout_s=120, env=mpi_env())
    assert res.returncode == 1, res.stderr
    lines = res.stderr.splitlines()
    assert "ds-launch: ranks 0 and 1 raised ConfigError (exit code 1):" in lines, res.stderr
    assert res.stderr.count(FULL) == 1 and res.stderr.count(PROBLEM) == 1, res.stderr
    assert "Traceback" not in res.stderr and "_load.py" not in res.stderr
    assert len(lines) <= 5, res.stderr  # the "a rank failed" line, the ranks, the message (2 lines)


def test_under_ds_launch_a_bug_keeps_its_traceback():
    res = run_cli(["--num_procs", "1", "--no_local_rank", SCRIPT, "bug"], timeout_s=120, env=mpi_env())
    assert res.returncode == 1, res.stderr
    assert "Traceback (most recent call last)" in res.stderr  # the rank's, through the hook it replaced
    assert "RuntimeError: a bug on rank 0" in res.stderr and "the first rank to fail" in res.stderr


@pytest.mark.mpi
@pytest.mark.skipif(_mpi_missing(), reason="needs ds-launch[mpi] (mpi4py and mpirun)")
def test_under_ds_launch_with_mpirun_the_message_is_printed_once():
    args = ["--launcher", "mpi", "--launcher_args", "--oversubscribe", "--num_procs", "2", "--no_local_rank"]
    res = run_cli([*args, SCRIPT, "config"], timeout_s=120, env=mpi_env())
    assert res.returncode == 1, res.stderr
    assert "ds-launch: ranks 0 and 1 raised ConfigError (exit code 1):" in res.stderr.splitlines(), res.stderr
    assert res.stderr.count(PROBLEM) == 1 and "Traceback" not in res.stderr, res.stderr


def _assert_rank_0_in_full_and_rank_1_in_one_line(output: str, rank_1_raised_first: bool = False) -> None:
    """Rank 0's message in full, once; rank 1's one line, which may be missing where rank 0 failed first:
    mpirun and torchrun then kill rank 1, possibly before it raised (its line only matters where rank 0
    did not fail the same way, and then rank 0 does not end the job first). Where rank 1 raised first,
    its line must be there, and rank 0's full message too (rank 1 waits for it before exiting)."""
    lines = [ln for ln in output.splitlines() if "ConfigError" in ln or PROBLEM in ln]
    assert lines.count("ConfigError: " + FULL) == 1, output
    assert sum(ln.startswith("  - " + PROBLEM) for ln in lines) == 1, output
    rank_1 = sum(ln.startswith(RANK1_LINE) for ln in lines)
    assert rank_1 == 1 if rank_1_raised_first else rank_1 <= 1, output
    assert len(lines) == 2 + rank_1, output  # nothing else (not torchrun's or mpirun's report)


@pytest.mark.parametrize("mode", ["config", "config-rank0-late"])
def test_under_torchrun_rank_0_prints_it_in_full_and_rank_1_one_line(mode):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    res = subprocess.run([*torchrun, SCRIPT, mode], capture_output=True, text=True, timeout=180)
    assert res.returncode == 1, res.stderr
    _assert_rank_0_in_full_and_rank_1_in_one_line(res.stderr, rank_1_raised_first=mode != "config")
    assert "ds_config" not in res.stderr  # no frame of ds's loading code (torchrun prints its own)


@pytest.mark.mpi
@pytest.mark.skipif(_mpi_missing(), reason="needs ds-launch[mpi] (mpi4py and mpirun)")
@pytest.mark.parametrize("mode", ["config", "config-rank0-late"])
def test_under_mpirun_rank_0_prints_it_in_full_and_rank_1_one_line(mode):
    cmd = ["mpirun", "--oversubscribe", "-n", "2", sys.executable, SCRIPT, mode]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=mpi_env())
    assert res.returncode != 0, res.stderr
    _assert_rank_0_in_full_and_rank_1_in_one_line(
        res.stdout + res.stderr, rank_1_raised_first=mode != "config"
    )
    assert "Traceback" not in res.stdout + res.stderr


def test_the_texts_for_rank_0_and_another_rank():
    error = ConfigError([ConfigProblem("a.b", "too big", 3), ConfigProblem("c", "missing")], source="ds.json")
    assert config_error_text(error, 0) == f"ConfigError: {error}\n"
    assert config_error_text(error, None) == f"ConfigError: {error}\n"
    assert config_error_text(error, 3) == (
        "ConfigError on rank 3 in ds.json (rank 0 prints it in full if it failed the same way): "
        "a.b = 3: too big (and 1 more)\n"
    )

"""init_distributed in this process: a world of one, idempotence, and its errors."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from ds_launch import LaunchEnvError, Topology, init_distributed  # noqa: E402
from ds_launch.cli import _free_port  # noqa: E402

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def _is_launch_var(name: str) -> bool:
    return name in LAUNCH_VARS or name.startswith(("OMPI_COMM_WORLD", "PMI_", "PMIX_", "SLURM_"))


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables; init_distributed's own exports are undone afterwards."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if _is_launch_var(name):
            monkeypatch.delenv(name)
    yield monkeypatch
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.clear()
    os.environ.update(saved)


def test_plain_python_is_a_world_of_one(clean_env):
    topo = init_distributed()
    assert isinstance(topo, Topology)
    assert (topo.rank, topo.local_rank, topo.world_size, topo.local_world_size) == (0, 0, 1, 1)
    assert topo.source == "default" and topo.master_addr == "127.0.0.1" and topo.master_port > 0
    assert topo.backend == ("nccl" if torch.cuda.is_available() else "gloo")
    x = torch.ones(2, device=topo.device)
    dist.all_reduce(x)
    assert x.tolist() == [1.0, 1.0]
    # Code written for torchrun/DeepSpeed reads the variables, so they are published.
    assert (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["MASTER_PORT"]) == (
        "0",
        "0",
        str(topo.master_port),
    )
    assert init_distributed() is topo
    assert "rank 0/1" in topo.describe()


def test_already_initialised_group_is_adopted(clean_env):
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    topo = init_distributed()
    assert (topo.rank, topo.world_size, topo.local_world_size, topo.source) == (0, 1, 1, "torch.distributed")


def test_already_initialised_group_must_match_the_launcher(clean_env):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        LaunchEnvError, match="already initialised as rank 0 of 1, but env:RANK says rank 1 of 2"
    ):
        init_distributed()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_says_use_gloo(clean_env):
    with pytest.raises(LaunchEnvError, match="backend='gloo'"):
        init_distributed(backend="nccl")


def test_mpi_env_without_mpi4py_needs_master_vars(clean_env):
    clean_env.setitem(sys.modules, "mpi4py", None)  # import fails as if it were not installed
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    with pytest.raises(LaunchEnvError) as info:
        init_distributed(timeout=timedelta(seconds=5))
    message = str(info.value)
    assert "MASTER_ADDR and MASTER_PORT are not set" in message
    assert "mpi4py is not installed" in message and "pip install 'ds-launch[mpi]'" in message


def test_mpi_env_without_mpi4py_uses_master_vars(clean_env):
    clean_env.setitem(sys.modules, "mpi4py", None)
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "1")
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
    topo = init_distributed(timeout=timedelta(seconds=20))
    assert (topo.source, topo.world_size, topo.local_world_size) == ("env:OMPI", 1, 1)


def test_pmix_without_mpi4py_says_what_to_install(clean_env):
    clean_env.setitem(sys.modules, "mpi4py", None)
    clean_env.setenv("PMIX_RANK", "0")
    with pytest.raises(LaunchEnvError, match=r"pip install 'ds-launch\[mpi\]'"):
        init_distributed()


def test_env_launch_without_master_is_an_error(clean_env):
    clean_env.setenv("RANK", "0")
    clean_env.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        LaunchEnvError, match="MASTER_ADDR and MASTER_PORT are not set and the launcher did not"
    ):
        init_distributed()


def _rank_procs(script_args: list[str], world_size: int) -> list[subprocess.Popen]:
    """``scripts/exit_rank.py`` on ``world_size`` ranks, started directly (no launcher to kill them)."""
    port = _free_port()
    script = str(Path(__file__).parent / "scripts" / "exit_rank.py")
    procs = []
    for rank in range(world_size):
        env = {k: v for k, v in os.environ.items() if not _is_launch_var(k)}
        env.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(
            subprocess.Popen(
                [sys.executable, script, *script_args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def test_a_clean_exit_destroys_the_process_group(tmp_path):
    # Leaving the process groups to interpreter teardown can abort a gloo rank
    # ("terminate called without an active exception"): init_distributed tears them down at exit.
    procs = _rank_procs([str(tmp_path), "clean"], 2)
    stderrs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], stderrs
    assert [(tmp_path / f"exit{r}.txt").read_text() for r in range(2)] == ["destroyed", "destroyed"]


def test_a_clean_exit_is_clean_in_a_group_someone_else_created(tmp_path):
    # torch 2.13 alone aborts a gloo rank at exit when its last collective's tensor died as the call
    # returned (11 of 12 4-rank runs here): the gloo thread that frees it needs the GIL during teardown.
    # init_distributed, handed a group Accelerate or the Trainer made, pauses at exit instead.
    for attempt in range(2):
        procs = _rank_procs([str(tmp_path), "theirs"], 4)
        stderrs = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, f"launch {attempt}: {stderrs}"


def test_exit_waits_for_a_thread_that_is_still_running(tmp_path):
    # The pause at exit lasts while another thread of the rank is still runnable (a gloo worker not yet
    # scheduled on a loaded machine must free its tensors before teardown), up to EXIT_SETTLE_MAX_S:
    # a thread busy for 0.8 s after the script's end finishes; with a fixed 0.2 s pause it is cut off.
    procs = _rank_procs([str(tmp_path), "busy"], 2)
    stderrs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], stderrs
    assert [(tmp_path / f"busy{r}.txt").exists() for r in range(2)] == [True, True]


def test_a_failing_rank_exits_without_waiting_for_its_peers(tmp_path):
    # Tearing down a group with a collective in flight waits for the peers; a rank that dies of an
    # exception must not, or it would hang with the peers waiting for it.
    rank0, rank1 = _rank_procs([str(tmp_path), "raise"], 2)
    try:
        stderr = rank0.communicate(timeout=60)[1]
        assert rank0.returncode == 1
        assert "RuntimeError: rank 0 failed with a collective in flight" in stderr
    finally:
        (tmp_path / "release").touch()
        rank1.communicate(timeout=120)


@pytest.mark.parametrize("mode", ["dropped", "dropped-theirs"])
def test_exit_joins_every_gloo_worker_before_finalization(tmp_path, mode):
    # The root of the abort at exit: a gloo worker that frees a collective's tensors once Python has begun
    # finalizing. Every group nobody holds any more (ours, or one torch made for someone else) is destroyed
    # and its workers joined at exit, here with a collective still in flight: no worker is left over.
    procs = _rank_procs([str(tmp_path), mode], 2)
    stderrs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], stderrs
    assert [(tmp_path / f"workers{r}.txt").read_text() for r in range(2)] == ["0", "0"], stderrs

"""The engine with ``offload_optimizer.device: "nvme"`` (ZeRO-3) under faults, on real processes and files.

One 2-rank run trains, saves a checkpoint and has rank 0 SIGKILLed in the middle of its next optimizer
step (swap files half rewritten). One 1-rank run then resumes that checkpoint at the other world size,
with nvme on the killed run's swap folder (whose files must be cleared, never read as state; the folder
of rank 1, absent at 1 rank, removed) and with
CPU offload (the losses must be equal), and fills a small tmpfs in a first step (a clear error with the
bytes needed; the checkpoint saved before it unchanged).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import _nvme_engine_workers as nw
import pytest
from rank_testing import free_port, spawn

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root)")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvme_faults")
    died = _kill_run(root)
    small = (
        root / "small"
    )  # room for the fp32 masters and gradients (~21 KB each), not for Adam's two moments
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], check=True)
    try:
        (resumed,) = spawn(nw.resume_one_rank, 1, str(root), timeout_s=300)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    return {"root": root, "died": died, "resumed": resumed}


def _kill_run(root) -> int:
    """Two rank processes of ``train_save_then_die``; returns rank 0's exit status once it is SIGKILLed
    (rank 1, left waiting for it in a collective, is then stopped)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, nw.__file__, str(root)],
            env={
                **os.environ,
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": str(r),
                "LOCAL_WORLD_SIZE": "2",  # never one left in the environment by an earlier test
                "OMP_NUM_THREADS": "1",
            },
        )  # fmt: skip
        for r in range(2)
    ]
    try:
        status = procs[0].wait(timeout=300)
        deadline = time.monotonic() + 10  # rank 1 may fail on its own when its peer's socket closes
        while procs[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    return status


def test_a_rank_killed_mid_step_leaves_the_checkpoint_untouched(runs):
    root = runs["root"]
    assert runs["died"] == -signal.SIGKILL and (root / "killed").exists(), "rank 0 was not killed mid-step"
    assert nw.digest(str(root / "ckpt")) == (root / "ckpt.sha256").read_text()


def test_resume_at_another_world_size_clears_the_stale_swap_files(runs):
    r = runs["resumed"]
    assert r["stale_before"], "the killed run left its swap files"
    assert r["nvme_loaded"] and r["cpu_loaded"]
    # every file in the folder is new: none of the killed run's survived to be read
    assert all(
        n not in r["stale_mtimes"] or r["fresh_files"][n] > r["stale_mtimes"][n] for n in r["fresh_files"]
    )
    assert r["nvme_losses"] == r["cpu_losses"], "nvme resumed differently from CPU offload"


def test_resume_at_fewer_ranks_removes_the_vanished_ranks_swap_folders(runs):
    """The 2-rank run's folder for rank 1 is never read at 1 rank: removed when the 1-rank run starts (it
    holds ds's marker and no live process holds it), so its disk space does not leak."""
    r = runs["resumed"]
    assert r["rank_folders_before"] == ["rank00000", "rank00001"], r["rank_folders_before"]
    assert r["rank_folders_after"] == ["rank00000"], r["rank_folders_after"]


def test_disk_full_mid_step_names_the_bytes_and_keeps_the_checkpoint(runs):
    r = runs["resumed"]
    error = r["full_error"]
    assert error is not None and error.startswith("NvmeSpaceError"), error
    assert "needs" in error and "bytes" in error and "free" in error and "nvme_path" in error, error
    assert r["ckpt0_before"] == r["ckpt0_after"]

"""NVMe optimizer offload at stage 3 (``offload_optimizer.device: "nvme"``) and the aio layer under it.

The aio keys are checked on ``AsyncFileIO`` directly (one process, real files); the optimizer on 2 real
gloo ranks in one spawn: parity with no offload and with CPU offload in fp32 and bf16, the swap files, the
buffers and pipelines, a resume, the faults (a full disk on a small tmpfs the test mounts, as root).
"""

from __future__ import annotations

import os
import subprocess
import sys

import _nvme_workers as nw
import pytest
import torch
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty
from rank_testing import spawn

MIB = 1 << 20


@pytest.fixture()
def quiet_gil():
    """Submission runs without a thread switch (so the queue fills as far as the options allow)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    yield
    sys.setswitchinterval(old)


def _io(**kw) -> AsyncFileIO:
    return AsyncFileIO(AioOptions(**kw))


def _data(nbytes: int) -> torch.Tensor:
    buf = aligned_empty(nbytes)
    buf.copy_(torch.randint(0, 256, (nbytes,), dtype=torch.uint8))
    return buf


def test_round_trip_through_o_direct(tmp_path):
    io = _io(block_size=MIB)
    src, back = _data(4 * MIB), aligned_empty(4 * MIB)
    io.write(str(tmp_path / "f"), 0, src).wait()
    io.read(str(tmp_path / "f"), 0, back).wait()
    assert torch.equal(src, back)
    assert io.stats.bytes_written == io.stats.bytes_read == 4 * MIB
    assert io.stats.direct_calls == io.stats.calls == 8, "aligned requests go through O_DIRECT"
    odd = torch.arange(1000, dtype=torch.float32)  # unaligned address/length: the buffered descriptor
    io.write(str(tmp_path / "g"), 12, odd).wait()
    out = torch.empty(1000)
    io.read(str(tmp_path / "g"), 12, out).wait()
    assert torch.equal(odd, out) and io.stats.direct_calls == 8
    io.close()


@pytest.mark.parametrize("block", [MIB, 256 * 1024])
def test_block_size_is_the_request_size(tmp_path, block):
    io = _io(block_size=block)
    io.write(str(tmp_path / "f"), 0, _data(4 * MIB)).wait()
    assert io.stats.calls == 4 * MIB // block
    io.close()


@pytest.mark.parametrize("depth,threads", [(1, 1), (2, 1), (2, 3)])
def test_queue_depth_and_thread_count_bound_the_requests_in_flight(tmp_path, quiet_gil, depth, threads):
    """thread_count x queue_depth chunks inside a system call at once (DeepSpeed's threads x libaio depth)."""
    io = _io(block_size=64 * 1024, queue_depth=depth, thread_count=threads)
    io.write(str(tmp_path / "f"), 0, _data(8 * MIB)).wait()
    assert io.stats.peak_in_flight == depth * threads
    assert len(io.stats.threads) <= depth * threads
    io.close()


def test_workers_are_thread_count_times_queue_depth(tmp_path, quiet_gil):
    io = _io(block_size=64 * 1024, queue_depth=2, thread_count=2)
    io.write(str(tmp_path / "f"), 0, _data(8 * MIB)).wait()
    assert len(io.stats.threads) == 4
    io.close()


def test_submission_does_not_wait_for_the_queue(tmp_path, quiet_gil):
    """More chunks than workers: the caller gets its handle at once, the rest wait in the pool's queue."""
    io = _io(block_size=64 * 1024, queue_depth=1, thread_count=1)
    handle = io.write(str(tmp_path / "f"), 0, _data(8 * MIB))
    assert io.stats.queued > 1, "the caller was held until the chunks ahead of its last one completed"
    handle.wait()
    assert io.stats.queued == 0 and io.stats.peak_queued == 128
    io.close()


def test_single_submit_keeps_one_request_in_flight(tmp_path, quiet_gil):
    io = _io(block_size=64 * 1024, queue_depth=8, thread_count=2, single_submit=True)
    io.write(str(tmp_path / "f"), 0, _data(4 * MIB)).wait()
    assert io.stats.peak_in_flight == 1 and io.stats.calls == 64
    io.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_events_returns_before_completion(tmp_path, quiet_gil, overlap):
    io = _io(block_size=64 * 1024, overlap_events=overlap)
    handle = io.write(str(tmp_path / "f"), 0, _data(8 * MIB))
    pending = io.stats.in_flight
    handle.wait()
    assert (pending > 0) == overlap
    io.close()


# ---------------------------------------------------------------------------------------- the optimizer
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvme")
    small = root / "small"  # room for the masters (a few KiB) and not for the optimizer state
    small.mkdir()
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(small)], check=True)
    try:
        return spawn(nw.parity_and_effects, 2, str(root), str(small) if mounted else None, timeout_s=600)
    finally:
        if mounted:
            subprocess.run(["umount", str(small)], check=True)


def test_losses_match_no_offload_and_cpu_offload(run):
    for rank, r in enumerate(run):
        bad = {k: v for k, v in r["parity"].items() if v != 0.0}
        assert not bad, f"rank {rank}: nvme differs from no offload / cpu offload: {bad}"


def test_state_lives_in_per_rank_files(run):
    for rank, r in enumerate(run):
        for name, s in r["runs"].items():
            assert s["folder"].endswith(os.path.join("ds_swap", f"rank{rank:05d}")), name
            n = s["partition_numel"]
            files = {f"g0.{k}.bin": 4 * n for k in ("exp_avg", "exp_avg_sq", "master")}
            assert s["files"] == {**files, ".ds-swap-folder": 0}, name  # and ds's marker (_swap_folders)
            assert s["master_storage_bytes"] == 0 and s["view_storage_bytes"] == 0, "no master in memory"
            assert s["state_bytes_in_memory"] == 0, "no element-wise optimizer state in memory between steps"
            # 3 steps: the first reads masters and writes masters + 2 states, then 3 tensors each way
            assert s["bytes_written"] == 4 * n * (1 + 3 * 3), name  # + the initial masters
            # reads: the first step's masters, 3 tensors in each later step, and fp32_state_dict's 3 tensors
            assert s["bytes_read"] == 4 * n * (1 + 3 * 2 + 3), name


def test_buffer_count_and_pipelines(run):
    for r in run:
        plain, piped = r["runs"]["float32/plain"], r["runs"]["float32/pipelined"]
        assert plain["buffers_allocated"] == 1 and piped["buffers_allocated"] == 3
        assert plain["reads_ahead"] == 0 and piped["reads_ahead"] > 0, "pipeline_read reads ahead"
        # pipeline_read: each of the 3 steps issues its first sub-groups' reads (one per buffer) before the norm
        assert plain["prefetched"] == 0 and piped["prefetched"] == 3 * min(3, piped["views"])
        assert plain["writes_deferred"] == 0
        assert piped["writes_deferred"] == 2 * piped["views"], (
            "pipeline_write: every write after the first step"
        )


def test_resume_from_a_checkpoint_state(run):
    for r in run:
        assert r["resume"]["diff"] == 0.0


def test_faults_name_the_path_and_stale_files_are_scratch(run):
    for r in run:
        f = r["faults"]
        assert "no-such-dir" in f["missing"] and "does not exist" in f["missing"]
        if os.geteuid() != 0:  # root writes anywhere
            assert "not writable" in f["readonly"]
        assert f["stale_diff"] == 0.0, "a stale swap file was read as state"
        assert "leftover.bin" not in f["stale_files"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_disk_full_names_the_bytes_needed(run):
    for r in run:
        error = r["disk_full"]["error"]
        assert error is not None and "needs" in error and "bytes" in error and "free" in error, r["disk_full"]

"""NVMe optimizer offload at stage 3 (``offload_optimizer.device: "nvme"``) and the aio layer under it.

The aio keys are checked on ``AsyncFileIO`` directly (one process, real files); the optimizer on 2 real
gloo ranks in one spawn: parity with no offload and with CPU offload in fp32 and bf16, the swap files, the
buffers and pipelines, a resume, the faults (a full disk on a small tmpfs the test mounts, as root).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading

import _nvme_workers as nw
import pytest
import torch
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty
from rank_testing import live_storage_bytes, spawn

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
    pending = io.stats.queued  # submitted, not completed: a worker may not have entered its system call yet
    handle.wait()
    assert (pending > 0) == overlap
    io.close()


def _adam_in_memory(init: torch.Tensor, grads: list[torch.Tensor], n: int, count: int) -> torch.Tensor:
    """Adam (lr 1e-2) over ``count`` views of ``n`` elements of ``init`` in memory, a step per gradient."""
    views = [init[i * n : (i + 1) * n].clone().requires_grad_(True) for i in range(count)]
    opt = torch.optim.Adam(views, lr=1e-2)
    for grad in grads:
        for i, v in enumerate(views):
            v.grad = grad[i * n : (i + 1) * n].clone()
        opt.step()
    return torch.cat([v.detach() for v in views])


def test_the_step_reads_a_sub_group_a_view_at_a_time_and_writes_it_in_one_request_per_tensor(tmp_path):
    """``OptimizerSwap`` with 10 views of 1024 elements and ``unit_numel`` 4096: sub-groups of 4, 4 and 2
    views, each read with one request per view and tensor (master, exp_avg, exp_avg_sq) and written with
    one request per tensor, and Adam's result bit for bit that of the views in memory."""
    from ds_zero.stage3._swap import OptimizerSwap, SwapFolder

    n, count = 1024, 10
    init = torch.randn(n * count, generator=torch.Generator().manual_seed(0))
    grads = [torch.randn(n * count, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3)]

    def swapped(unit):
        views = [init[i * n : (i + 1) * n].clone().requires_grad_(True) for i in range(count)]
        opt = torch.optim.Adam(views, lr=1e-2)
        io = _io(block_size=1 << 30)  # one chunk per request: calls count requests
        folder = SwapFolder(str(tmp_path), 0, "offload_optimizer", name=f"unit{unit}")
        swap = OptimizerSwap(
            folder,
            io,
            [views],
            buffer_count=2,
            pipeline_read=False,
            pipeline_write=False,
            pin_memory=False,
            unit_numel=unit,
        )
        swap.init_masters(lambda g, lo, hi: init[lo:hi])
        calls, seen = [], []
        for grad in grads:
            before, live = io.stats.calls, live_storage_bytes()
            swap.step(opt, [grad], 1.0, lambda g, lo, hi, master: seen.append((lo, hi, master.clone())))
            calls.append(io.stats.calls - before)
            # the buffers are released when the step ends (what stays: the views' new masters seen above)
            # (and the first step's scalar state: Adam's ``step``, 4 bytes a view)
            assert 0 <= live_storage_bytes() - live - count * n * 4 < 1024 and swap.buffers_allocated == 0
            seen[:] = seen[-count:]
        with swap.resident(opt, write=False) as masters:
            out = masters[0].clone()
        io.close()
        return out, calls, seen, swap

    expected = _adam_in_memory(init, grads, n, count)

    out, calls, seen, swap = swapped(4 * n)
    assert swap.units == [(0, 0, 4), (0, 4, 8), (0, 8, 10)]
    assert torch.equal(out, expected)
    # the first step: the master in a view at a time and out a sub-group at a time, the new moments out a
    # view at a time; then 3 tensors in a view at a time and out a sub-group at a time
    assert calls == [count + 3 + 2 * count, 3 * count + 3 * 3, 3 * count + 3 * 3]
    assert [(lo, hi) for lo, hi, _ in seen[-count:]] == [(i * n, (i + 1) * n) for i in range(count)]
    assert torch.equal(torch.cat([m for _, _, m in seen[-count:]]), expected), "each view's new master"
    assert swap.buffer_bytes == 3 * 4 * 4 * n
    one_by_one, calls1, _, swap1 = swapped(None)  # a view a time: 6 requests per view
    assert torch.equal(one_by_one, expected) and calls1[1:] == [count * 6] * 2
    assert swap1.buffer_bytes == 3 * 4 * n


# ---------------------------------------------------------------------------------------- the optimizer
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nvme")
    small = (
        root / "small"
    )  # room for the masters and gradients (a page each per rank), not the optimizer state
    small.mkdir()
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)], check=True)
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
            n, es = s["partition_numel"], s["grad_itemsize"]
            files = {f"g0.{k}.bin": 4 * n for k in ("exp_avg", "exp_avg_sq", "master")}
            # the gradient in the model dtype, and ds's marker (_swap_folders)
            assert s["files"] == {**files, "g0.grad.bin": es * n, ".ds-swap-folder": 0}, name
            assert s["master_storage_bytes"] == 0 and s["view_storage_bytes"] == 0, "no master in memory"
            assert s["state_bytes_in_memory"] == 0, "no element-wise optimizer state in memory between steps"
            # 3 steps: the first reads masters and writes masters + 2 states, then 3 tensors each way
            assert s["bytes_written"] - s["grad_bytes_written"] == 4 * n * (1 + 3 * 3), (
                name
            )  # + initial masters
            # reads: the first step's masters, 3 tensors in each later step, and fp32_state_dict's 3 tensors
            assert s["bytes_read"] - s["grad_bytes_read"] == 4 * n * (1 + 3 * 2 + 3), name
            # gradients: each of the 6 backwards writes the partition (the second of a step adds, so it reads
            # it first, all but the padding); each step reads it once, with the state: the norm was taken
            # as the backward wrote it (at most the padding's pieces are read again)
            assert 6 * es * n >= s["grad_bytes_written"] > 5 * es * n, name
            assert s["grad_bytes_read"] - 3 * es * n in range(0, 3 * es * n + 1), name
            assert s["norm_bytes_read"] == 0, name


def test_buffer_count_and_pipelines(run):
    for r in run:
        plain, piped = r["runs"]["float32/plain"], r["runs"]["float32/pipelined"]
        assert plain["buffers_allocated"] == 1 and piped["buffers_allocated"] == 3
        assert plain["buffers_alive_after"] == piped["buffers_alive_after"] == 0, "released after each step"
        assert plain["reads_ahead"] == 0 and piped["reads_ahead"] > 0, "pipeline_read reads ahead"
        # pipeline_read: each of the 3 steps issues its first sub-groups' reads (one per buffer) before the norm
        assert plain["prefetched"] == 0 and piped["prefetched"] == 3 * min(3, piped["views"])
        assert plain["writes_deferred"] == 0
        assert piped["writes_deferred"] == 2 * piped["views"], (
            "pipeline_write: every write after the first step"
        )


class _HeldReads(AsyncFileIO):
    """Real reads, except that those of the master file at or past byte ``hold_from`` wait for ``release``."""

    def __init__(self, hold_from: int) -> None:
        super().__init__(AioOptions(block_size=1 << 30))
        self.hold_from, self.release = hold_from, threading.Event()

    def _io(self, f, piece, offset: int, write: bool) -> None:
        if not write and f.path.endswith("master.bin") and offset >= self.hold_from:
            if not self.release.wait(20):
                raise TimeoutError("a later view's read was held and nothing stepped the first view")
        super()._io(f, piece, offset, write)


def test_a_view_steps_while_its_sub_groups_later_views_are_read(tmp_path):
    """The step of a sub-group's first view does not wait for the reads of its later views: with every
    master read past the first view held until the inner optimizer has stepped once, the step completes
    (waiting for the whole sub-group first, it would wait for a read that waits for it) and Adam's result
    is that of the views in memory."""
    from ds_zero.stage3._swap import OptimizerSwap, SwapFolder

    n, count = 1024, 4
    init = torch.randn(n * count, generator=torch.Generator().manual_seed(0))
    grads = [torch.randn(n * count, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    views = [init[i * n : (i + 1) * n].clone().requires_grad_(True) for i in range(count)]
    io = _HeldReads(hold_from=n * 4)

    class Adam(torch.optim.Adam):
        def step(self, closure=None):
            io.release.set()
            return super().step(closure)

    opt = Adam(views, lr=1e-2)
    folder = SwapFolder(str(tmp_path), 0, "offload_optimizer")
    swap = OptimizerSwap(
        folder, io, [views], buffer_count=1, pipeline_read=False, pipeline_write=False, pin_memory=False,
        unit_numel=count * n,
    )  # fmt: skip
    swap.init_masters(lambda g, lo, hi: init[lo:hi])
    assert swap.units == [(0, 0, count)]
    for grad in grads:
        io.release.clear()
        swap.step(opt, [grad], 1.0, lambda g, lo, hi, master: None)
    with swap.resident(opt, write=False) as masters:
        out = masters[0].clone()
    io.close()

    assert torch.equal(out, _adam_in_memory(init, grads, n, count))


def test_a_sub_group_of_several_views_is_read_and_written_whole(run):
    """``sub_group_size`` (24) above the views (8 elements, STEP_PIECE patched): a buffer holds 3 views (read
    a view at a time, written in one request per tensor); the weights match
    (test_losses_match_...["*/nvme-units"])."""
    for r in run:
        units, plain = r["runs"]["float32/units"], r["runs"]["float32/plain"]
        assert units["units"] == plain["views"] < units["views"]
        assert units["buffer_bytes"] >= 3 * 4 * 24, "a buffer holds a whole sub-group's master and 2 moments"
        assert units["buffers_allocated"] == 2


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


# ---------------------------------------------------------------------------- gradients in files (issue 36)
def test_gradients_in_files_give_the_losses_of_gradients_in_memory_on_2_ranks(run):
    """fp32 and bf16, gradient accumulation 1 and 2, with gradient_clipping: bit for bit (the norm too)."""
    for rank, r in enumerate(run):
        bad = {k: v for k, v in r["grads"].items() if v["loss"] or v["weights"] or v["norm"]}
        assert not bad, f"rank {rank}: gradients in files differ from gradients in memory: {bad}"
        assert all(v["read_adds"] > 0 for k, v in r["grads"].items() if "gas2" in k), "accumulated on disk"


def test_an_inf_in_the_gradient_files_skips_the_step_on_every_rank(run):
    for rank, r in enumerate(run):
        ram, nvme = r["overflow"]["ram"], r["overflow"]["nvme"]
        assert nvme["skipped"] and nvme["unchanged"] and nvme["applied"], (rank, nvme)
        diff = max((nvme["weights"][k] - v).abs().max().item() for k, v in ram["weights"].items())
        assert diff == 0.0, "the step after the skipped one differs from the in-memory gradients'"


def test_full_grad_reads_and_writes_the_gradient_files(run):
    for r in run:
        ram, nvme = r["fragments"]["ram"], r["fragments"]["nvme"]
        assert ram["grads"].keys() == nvme["grads"].keys()
        for what in ("grads", "weights"):
            diff = max((nvme[what][k] - v).abs().max().item() for k, v in ram[what].items())
            assert diff == 0.0, what


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    root = tmp_path_factory.mktemp("gradswap")
    tiny = root / "tiny"  # room for less than the 64 MiB gradient file
    tiny.mkdir()
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tiny)], check=True)
    try:
        return spawn(nw.grads_on_disk, 1, str(root), str(tiny) if mounted else None, timeout_s=600)[0]
    finally:
        if mounted:
            subprocess.run(["umount", str(tiny)], check=True)


def test_gradient_partition_lives_in_a_file_not_in_memory(one):
    ram, nvme = one["ram"], one["nvme"]
    n = nvme["partition_bytes"]
    assert n == 64 * MIB
    # in memory the partition is alive after each backward; in files only what a bucket needs (1M elements)
    assert min(ram["grown"]) >= n, ram
    assert max(nvme["grown"]) < n // 8, nvme
    assert nvme["peak_staged_bytes"] <= 3 * (4 * MIB + 4096), "at most the slices in flight are staged"
    assert nvme["read_adds"] > 0
    assert nvme["files"].get("g0.grad.bin") == n, nvme["files"]


def test_gradients_in_files_on_1_rank(one):
    bad = {k: v for k, v in one["parity"].items() if v["loss"] or v["weights"] or v["norm"]}
    assert not bad, bad


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_disk_too_small_for_the_gradient_file_names_the_bytes(one):
    error = one["disk_full"]
    assert error is not None and "g0.grad.bin" in error and f"needs {64 * MIB} bytes" in error, error


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_gradient_write_that_finds_the_disk_full_raises_at_the_backward(tmp_path):
    """A file system where the reservation does not hold (here: the reserved file is gone and the disk
    filled): the write of a reduced slice fails, and the end of the backward (``finish``) says so."""
    from ds_zero.stage3._grad_swap import GradSwap
    from ds_zero.stage3._swap import NvmeSpaceError, SwapFolder

    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)], check=True)
    swap = None
    try:
        io = _io()
        swap = GradSwap(SwapFolder(str(tmp_path), 0, "offload_optimizer"), io, [8192], [torch.float32])
        os.remove(swap.path(0))
        fd = os.open(tmp_path / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"x" * 4096)
        os.close(fd)
        swap.add(0, 0, 8192, torch.ones(8192), 1.0)
        with pytest.raises(NvmeSpaceError, match=r"g0\.grad\.bin: needs 32768 bytes"):
            swap.finish()
        io.close()
    finally:
        swap = None  # its folder holds a lock on ds's marker file (_swap_folders): let go before the unmount
        gc.collect()
        subprocess.run(["umount", str(tmp_path)], check=True)

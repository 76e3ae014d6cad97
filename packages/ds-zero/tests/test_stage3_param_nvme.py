"""NVMe parameter offload at stage 3 (``offload_param.device: "nvme"``), on real gloo ranks and real files.

One spawn of 2 ranks runs every case: parity in fp32 (parameters alone on nvme, with the optimizer too,
half the pieces in memory) and bf16 (both on nvme); where the partitions are; the buffers; the read-ahead;
faults; a checkpoint round trip. The effects are observed: file sizes, the bytes of every tensor storage
alive in the process, buffers counted, reads in flight counted at each module's forward. One rank and 4
ranks are covered at the engine level: integration/test_engine_parity.py's ``stage3-fp32-gas1-nvme`` runs
in every integration session and is resumed at 4 ranks from 2.
"""

from __future__ import annotations

import os
import subprocess

import _param_nvme_workers as pw
import pytest
from rank_testing import spawn

_ALIGN = 4096


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("pnvme2")
    ro = root / "ro"  # not writable even by root: a read-only file system
    small = root / "small"  # too small for the parameter files
    ro.mkdir()
    small.mkdir()
    mounted = os.geteuid() == 0
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(small)], check=True)
    try:
        return spawn(pw.main, 2, str(root), True, timeout_s=600)
    finally:
        if mounted:
            subprocess.run(["umount", str(ro)], check=True)
            subprocess.run(["umount", str(small)], check=True)


def test_losses_match_no_offload_and_cpu_offload_on_2_ranks(two):
    for rank, r in enumerate(two):
        bad = {k: v for k, v in r["parity"].items() if v["loss"] != 0.0 or v["weights"] != 0.0}
        assert not bad, f"rank {rank}: nvme differs from no offload: {bad}"
        print(f"rank {rank} seconds: {r['seconds']}")
        for name in ("nvme-param", "nvme-both", "nvme-half"):
            assert r["parity"][f"float32/{name}"]["reads"] > 0


def test_new_weights_are_written_while_the_next_sub_groups_step(two):
    """The step's weight writes are left in flight (each holding its buffer) while the optimizer steps the
    next sub-groups: at some sub-group's step, writes issued for earlier sub-groups are not waited for yet
    (with the optimizer on nvme, where the step is streamed per sub-group). The losses above are exactly
    those without offload, so the reads that follow see the new values. With the parameters alone on nvme
    the step writes every piece after the update, all in flight at once (up to buffer_count). Unwired
    (``_master_updated`` waiting for each write) every count sampled is 0."""
    for rank, r in enumerate(two):
        for name in ("float32/nvme-both", "float32/nvme-half", "bfloat16/nvme-both"):
            run = r["parity"][name]
            pending = [p for p, _ in run["pending_at_step"]]
            assert len(pending) > 3 and max(pending) > 0, (rank, name, run["pending_at_step"])
            assert run["writes_behind"] > 0
            # sub-groups of 24 elements end inside pieces: each piece is still written once per step, when
            # the sub-groups have covered it, never read back for it (the losses show no lost update)
            assert run["step_piece_writes"] == run["file_pieces_x_steps"] > 0, (rank, name, run)
            assert run["settled"] == 0, (rank, name, run)
        assert r["parity"]["float32/nvme-param"]["writes_behind"] > 0


def test_partitions_live_in_per_rank_files_within_max_in_cpu(two):
    for rank, r in enumerate(two):
        e = r["effects"]
        n = e["disk"]["partition_numel"]
        for name, in_files in (("disk", n), ("half", n - 66_048), ("ram", 0)):
            run = e[name]
            assert run["folder"].endswith(f"ds_swap_params/rank{rank:05d}")
            assert run["file_numel"] == in_files and run["cpu_numel"] == n - in_files, (name, run)
            # every piece in the files, each at an aligned offset: the file holds exactly those bytes
            assert in_files * 4 <= run["files"]["g0.param.bin"] < in_files * 4 + 32 * _ALIGN, (name, run)
        # the partitions not kept in memory are not allocated anywhere in the process
        ram, half, disk = (e[k]["live_bytes"] for k in ("ram", "half", "disk"))
        assert ram - disk >= 0.6 * n * 4, (ram, disk, n)
        assert ram > half > disk, (ram, half, disk)


def test_buffer_count_and_buffer_size_bound_the_buffers(two):
    for r in two:
        e = r["effects"]
        size = -(-16_384 * 4 // _ALIGN) * _ALIGN
        for count in (2, 5):
            b = e[f"buffers-{count}"]
            assert 1 <= b["allocated"] <= count and b["peak_in_use"] <= count, b
            assert b["buffer_bytes"] == [size] * b["allocated"], b
        assert e["buffers-2"]["allocated"] == 2
        assert e["buffers-5"]["allocated"] > 2, "more buffers allowed: more are used for reads ahead"
        assert "buffer_size 1000" in e["small_buffer"] and "layers." in e["small_buffer"]


def test_reads_of_the_next_modules_are_in_flight_when_a_module_starts(two):
    for r in two:
        e = r["effects"]
        for count in (2, 5):
            b = e[f"buffers-{count}"]
            assert b["reads_ahead"] > 0 and max(b["ahead_at_forward"]) > 0, b
            assert max(b["ahead_at_forward"]) <= count
        assert max(e["buffers-5"]["ahead_at_forward"]) > max(e["buffers-2"]["ahead_at_forward"])
        # stage3_prefetch_bucket_size 0: no prefetch, so no read ahead either
        assert e["no-prefetch"]["reads_ahead"] == 0 and max(e["no-prefetch"]["ahead_at_forward"]) == 0


def test_faults_name_the_path_and_stale_files_are_scratch(two):
    for r in two:
        f = r["faults"]
        assert "no-such-dir" in f["missing"] and "offload_param.nvme_path" in f["missing"], f
        assert "/ro'" in f["readonly"] and "not writable" in f["readonly"], f
        assert f["stale_loss_diff"] == 0.0, "a killed run's swap file was read as the weights"
        assert f["stale_files"] == [".ds-swap-folder", "g0.param.bin"], f
        if os.geteuid() == 0:  # the test mounted the small tmpfs
            assert (
                "g0.param.bin" in f["disk_full"] and "needs" in f["disk_full"] and "free" in f["disk_full"]
            ), f


def test_swap_folders_of_ranks_the_run_does_not_have_are_removed_unless_in_use_or_not_ds(two):
    for r in two:
        v = r["faults"]["vanished"]
        assert v["before"] == [f"rank{i:05d}" for i in (2, 3, 4, 5)], v
        # rank 4's folder is held by a live process (another job), rank00005 has no ds marker
        assert v["after"] == [f"rank{i:05d}" for i in (0, 1, 4, 5)], v


def test_checkpoint_saved_with_params_on_disk_resumes(two):
    for r in two:
        assert r["checkpoint"] == {"nvme": 0.0, "none": 0.0}, r["checkpoint"]


def test_a_partly_updated_piece_needed_before_the_step_covers_it_is_completed_from_its_file(tmp_path):
    """A piece the step has written only part of is written once the step covers it; needed earlier (a
    gather, the step's end), its other elements are read from its file first: nothing is lost either way,
    and no memory beyond the ``buffer_count`` buffers is allocated for it (allocations counted by torch's
    profiler: the reads go into the piece's own buffer)."""
    import torch
    from ds_zero._aio import AioOptions, AsyncFileIO
    from ds_zero.stage3._param_swap import ParamSwap
    from ds_zero.stage3._swap import SwapFolder
    from torch.profiler import ProfilerActivity, profile

    io = AsyncFileIO(AioOptions())
    swap = ParamSwap(SwapFolder(str(tmp_path), 0, "offload_param", name="ds_swap_params"), io,
                     buffer_count=2, buffer_size=4096, max_in_cpu=0, pin_memory=False)  # fmt: skip
    swap.add_group(torch.float32, [("a", "a", 0, 3000), ("b", "b", 3000, 4000)])
    old = torch.arange(4000, dtype=torch.float32)
    swap.write_piece("a", old[:3000])
    swap.write_piece("b", old[3000:])
    writes = swap.piece_writes
    swap.write_range(0, 0, 1000, -old[:1000], wait=False)  # a third of "a": not written yet
    assert swap.piece_writes == writes and swap.writes_pending() == 0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as settling:
        got = swap.piece("a")  # needed now: completed from the file
    got = got.clone()
    swap.done("a")
    assert torch.equal(got, torch.cat([-old[:1000], old[1000:3000]])) and swap.settled == 1
    swap.write_range(0, 1000, 3500, -old[1000:3500], wait=False)  # the rest of "a", half of "b"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as flushing:
        swap.flush()  # the step's end: both completed from their files
    assert torch.equal(swap.read_range(0, 0, 4000), torch.cat([-old[:3500], old[3500:]]))
    assert swap.settled == 3 and swap.piece_writes == writes + 3
    for prof in (settling, flushing):
        allocated = [(e.name, e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage > 0]
        assert allocated == [], allocated
    assert swap.buffers_allocated <= 2
    io.close()

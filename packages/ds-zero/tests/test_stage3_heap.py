"""Stage 3 hands freed heap back to the OS after wrapping and after each step (``ds_zero.stage3._heap``)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import _nvme_workers as nw
import _stage3_workers as w
import pytest
import torch
from ds_zero import ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options, _heap
from rank_testing import spawn

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or _heap._trim is None, reason="glibc's malloc_trim and /proc: Linux only"
)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


def _retained_heap_mb() -> tuple[float, torch.Tensor]:
    """Free ~80 MiB of heap that glibc keeps resident: 2 MiB blocks (on the heap once a 24 MiB block was
    freed, which raises the mmap threshold), all freed but the last, which pins the heap's top."""
    big = torch.ones(6 << 20)  # 24 MiB: mmapped; freeing it raises the threshold above 2 MiB
    del big
    blocks = [torch.ones(512 << 10) for _ in range(41)]  # 2 MiB each, written: resident
    last = blocks.pop()
    before = _rss_mb()
    del blocks
    return before - _rss_mb(), last


def test_release_freed_heap_returns_it_to_the_os(monkeypatch):
    dropped_by_free, pin = _retained_heap_mb()
    assert dropped_by_free < 40, "the setup must leave freed heap resident (else it tests nothing)"
    before = _rss_mb()
    assert _heap.release_freed_heap()
    assert before - _rss_mb() > 60, "malloc_trim(0) hands the freed heap back"
    del pin

    # a threshold above what is free: nothing is handed back; below it: trimmed
    _, pin = _retained_heap_mb()
    before = _rss_mb()
    assert not _heap.release_freed_heap(at_least=200 << 20)
    assert before - _rss_mb() < 40, "less free than at_least: the heap is kept"
    assert _heap.release_freed_heap(at_least=20 << 20)
    assert before - _rss_mb() > 60
    del pin

    monkeypatch.setenv("DS_ZERO_MALLOC_TRIM", "0")
    _, pin = _retained_heap_mb()
    before = _rss_mb()
    assert not _heap.release_freed_heap()
    assert before - _rss_mb() < 40, "DS_ZERO_MALLOC_TRIM=0 leaves the heap alone"


def test_a_fixed_mmap_threshold_unmaps_large_blocks_when_freed():
    """After ``fix_mmap_threshold`` the blocks ``_retained_heap_mb`` frees leave the resident set at once
    (without it they stay: the first test's setup check). In a fresh interpreter: the setting is process-wide."""
    here, testing = Path(__file__).parent, Path(__file__).parents[3] / "testing"  # this module's imports
    code = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(testing)!r}]; import test_stage3_heap as t; "
        "from ds_zero.stage3 import _heap; assert _heap.fix_mmap_threshold(); print(t._retained_heap_mb()[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out.split()[-1]) > 60, "the 2 MiB blocks were mapped one by one and unmapped when freed"


def test_an_optimizer_on_nvme_fixes_the_mmap_threshold_and_says_so_once(tmp_path):
    """``optimizer_nvme`` (the streamed step) fixes the threshold when the optimizer is built, for a ds-zero
    user outside the engine too, and logs it once at INFO on ``ds_zero``; state in memory leaves glibc's
    own (rising) threshold. On a fresh rank process: the setting is process-wide."""
    (r,) = spawn(nw.mmap_threshold, 1, str(tmp_path), timeout_s=300)
    assert r["before"] is None and r["cpu"] is None, r
    assert r["nvme"] == _heap.STREAMED_MMAP_THRESHOLD, r
    assert len(r["logged"]) == 1, r["logged"]
    assert str(_heap.STREAMED_MMAP_THRESHOLD) in r["logged"][0] and "nvme" in r["logged"][0], r["logged"]


def test_the_optimizer_trims_after_wrapping_and_after_steps_that_free_enough(monkeypatch):
    """After wrapping always; after a step when more than DS_ZERO_MALLOC_TRIM_MIN_MIB is free (the small
    Net's steps free far less than the default 64 MiB)."""
    import torch.distributed as dist
    from rank_testing import free_port

    if dist.is_initialized():  # a test file run before in this process left its group behind
        dist.destroy_process_group()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = w.Net()
        before = _heap.trims
        zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters()), Stage3Options())
        assert _heap.trims == before + 1
        # glibc's free-heap count is the whole process's: earlier test files in this worker may have left
        # more than 64 MiB free that a trim cannot give back (fragmented). The threshold sits 64 MiB above
        # what is free now, so only what these small steps free counts, and that is far less.
        free_mib = (_heap.free_heap_bytes() or 0) / 2**20
        monkeypatch.setenv("DS_ZERO_MALLOC_TRIM_MIN_MIB", str(free_mib + 64))
        w.train(model, zero, 0, 1, 2, 1)
        assert _heap.trims == before + 1
        monkeypatch.setenv("DS_ZERO_MALLOC_TRIM_MIN_MIB", "0")
        w.train(model, zero, 0, 1, 2, 1, first=2)
        assert _heap.trims == before + 3
    finally:  # later test files make their own group
        dist.destroy_process_group()

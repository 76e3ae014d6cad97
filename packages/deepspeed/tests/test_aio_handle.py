"""``AsyncIOBuilder().load().aio_handle`` on real files returns what DeepSpeed 0.19.8's compiled op returns.

The same calls (tools/fixtures/make_deepspeed_aio_fixtures.py's ``CASES``) were run on DeepSpeed's op and recorded
(fixtures/deepspeed_aio_handle.json); here they run on ds's (``deepspeed.ops.aio._handle``, over ds's thread pool
of ``preadv``/``pwritev``). Where DeepSpeed aborted the process (a failed C++ assertion), ds raises at
that call instead; where DeepSpeed wrote nothing without saying so (an unaligned size), ds writes.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from deepspeed.ops.aio import AsyncIOBuilder
from deepspeed.ops.op_builder import AsyncIOBuilder as BuilderFromOpBuilder

ROOT = Path(__file__).resolve().parents[3]
RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_aio_handle.json").read_text())
_spec = importlib.util.spec_from_file_location(
    "aio_rec", ROOT / "tools/fixtures/make_deepspeed_aio_fixtures.py"
)
REC = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(REC)

# what ds raises where DeepSpeed aborted the process
RAISES_INSTEAD = {"async_round_trip": "RuntimeError", "read_past_end": "ValueError"}


def test_the_builder_loads_the_op():
    assert BuilderFromOpBuilder is AsyncIOBuilder
    assert AsyncIOBuilder().is_compatible() == RECORD["is_compatible"]
    op = AsyncIOBuilder().load()
    assert sorted(n for n in dir(op) if not n.startswith("_")) == RECORD["op_names"]


@pytest.mark.parametrize("name", [c[0] for c in REC.CASES])
def test_calls_return_what_deepspeed_returns(name):
    op = AsyncIOBuilder().load()
    kwargs, calls = next((k, c) for n, k, c in REC.CASES if n == name)
    got = REC._run_case(op, kwargs, calls)
    want = RECORD["cases"][name]
    if "aborted" in want:
        n = len(want["returns"])
        if name == "unaligned_size":  # DeepSpeed's write "succeeded" and left the file empty
            assert got["returns"] == [1, 1] and got["equal"] == [True] and got["sizes"] == {"a": 4000}
            return
        assert got["returns"][:n] == want["returns"]
        assert got["returns"][n] == {"raises": RAISES_INSTEAD[name]}, "where DeepSpeed aborted, ds raises"
        return
    assert got == want


def test_the_data_goes_through_the_files_not_memory(tmp_path):
    """What one handle writes another reads back from the file (nothing kept in the handle)."""
    op = AsyncIOBuilder().load()
    src = torch.randn(1 << 18)
    writer = op.aio_handle(block_size=65536, queue_depth=4, intra_op_parallelism=2)
    assert writer.async_pwrite(src, str(tmp_path / "x")) == 0
    assert writer.wait() == 1
    assert (tmp_path / "x").stat().st_size == src.numel() * 4
    back = torch.zeros_like(src)
    reader = op.aio_handle()
    assert reader.sync_pread(back, str(tmp_path / "x")) == 1
    assert torch.equal(back, src)
    # the handle's block size and threads reach the I/O layer: 16 chunks of 64 KiB over 2 x 4 workers
    assert writer.io.stats.calls == 16 and writer.io.workers == 8


def test_locked_tensors_are_aligned_and_known(tmp_path):
    h = AsyncIOBuilder().load().aio_handle()
    t = h.new_cpu_locked_tensor(1000, torch.empty(0, dtype=torch.bfloat16))
    assert t.dtype == torch.bfloat16 and t.numel() == 1000 and t.data_ptr() % 4096 == 0
    assert h.is_pinned(t) and not h.is_pinned(torch.empty(10))
    assert h.free_cpu_locked_tensor(t) and not h.is_pinned(t)


@pytest.mark.parametrize("stage", [1, 2])
def test_nvme_optimizer_offload_below_stage_3_is_refused_as_deepspeed_makes_it_cpu(stage, tmp_path):
    """DeepSpeed 0.19.8 at stages 1/2 steps the 'nvme' state with DeepSpeedCPUAdam in CPU memory and writes no
    file under nvme_path (recorded); ds refuses the config, saying so, instead of doing the same silently."""
    seen = RECORD["stage12_nvme"][f"stage{stage}"]
    assert seen["optimizer_cpu_offload"] and seen["state_devices"] == ["cpu"]
    assert seen["files_under_nvme_path"] == [] and not seen["zero_nvme_offload_optimizer"]
    from ds_config import ConfigError, load_config

    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)},
        },
    }
    with pytest.raises(ConfigError, match="CPU memory, as DeepSpeed does silently"):
        load_config(cfg)

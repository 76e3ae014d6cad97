"""tools/bench/bench_training.py measures memory from live storages (never from its formula) and times real steps."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the benchmark's tests run in the integration session")

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tools" / "bench"), str(ROOT / "testing")]
import _bench_memory  # noqa: E402
import bench_training  # noqa: E402
from _bench_cases import MODELS, combine_ranks, run_case  # noqa: E402
from rank_testing import spawn  # noqa: E402

MIB = 2**20


def test_live_bytes_count_each_storage_once() -> None:
    before = _bench_memory.live_tensor_bytes()
    big = torch.empty(MIB, dtype=torch.uint8)
    assert _bench_memory.live_tensor_bytes() - before == MIB
    views = [big[: MIB // 2], big.view(torch.float32), big[1:]]  # views share big's storage
    assert _bench_memory.live_tensor_bytes() - before == MIB
    del big, views
    assert _bench_memory.live_tensor_bytes() == before


def test_live_bytes_see_grads_that_have_no_python_object() -> None:
    """A gradient written by backward lives in C++ until read: the walk must still count it."""
    layer = torch.nn.Linear(256, 256, bias=False)  # 256 KiB of fp32 weight
    before = _bench_memory.live_tensor_bytes()
    layer(torch.ones(1, 256)).sum().backward()
    assert _bench_memory.live_tensor_bytes() - before == 256 * 256 * 4


def test_live_bytes_see_optimizer_state() -> None:
    layer = torch.nn.Linear(256, 256, bias=False)
    opt = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 256)).sum().backward()
    before = _bench_memory.live_tensor_bytes()
    opt.step()  # creates exp_avg and exp_avg_sq (and a scalar step)
    added = _bench_memory.live_tensor_bytes() - before
    assert 2 * 256 * 256 * 4 <= added <= 2 * 256 * 256 * 4 + 64


def test_peak_rss_follows_touched_memory() -> None:
    _bench_memory.reset_peak_rss()
    start = _bench_memory.peak_rss_bytes()
    block = torch.ones(64 * MIB, dtype=torch.uint8)  # ones() touches every page
    assert _bench_memory.peak_rss_bytes() - start >= 60 * MIB
    del block


def test_formula_is_the_zero_papers() -> None:
    """16 bytes per parameter in both dtypes, divided per stage as in the ZeRO paper."""
    n, world = 1000, 4
    assert bench_training.zero_formula_bytes(n, 0, "fp32", world) == 16 * n
    assert bench_training.zero_formula_bytes(n, 1, "bf16", world) == (2 + 2 + 12 / 4) * n
    assert bench_training.zero_formula_bytes(n, 2, "fp32", world) == (4 + 12 / 4) * n
    assert bench_training.zero_formula_bytes(n, 3, "bf16", world) == 16 * n / 4


@pytest.mark.timeout(600)
def test_ddp_case_measures_its_own_state_without_the_ceiling_copy() -> None:
    """DDP after a step holds weights and Adam's moments: 3x the weights. The ceiling copy (1x more)
    must have been dropped before measuring, and the ceiling and step are timed for every step."""
    spec = {"impl": "ddp", "stage": 0, "dtype": "fp32", "model": "tiny", "steps": 2, "warmup": 1}
    result = combine_ranks(spawn(run_case, 2, spec, timeout_s=500))
    weights = result["numel"] * 4
    assert 3 * weights <= result["live_bytes_after_step"] < 3 * weights + weights // 4
    assert 4 * weights <= result["live_bytes_after_backward"] < 4 * weights + weights // 4  # + grads
    assert len(result["step_s"]) == len(result["ceiling_s"]) == 2
    assert all(s > 0 for s in result["step_s"] + result["ceiling_s"])
    assert result["numel"] == sum(p.numel() for p in bench_training_model().parameters())


def bench_training_model() -> torch.nn.Module:
    from _bench_cases import make_model

    return make_model(MODELS["tiny"])


def test_ds_mpi_cases_run_under_mpirun_and_get_their_own_ratio_line() -> None:
    import argparse

    args = argparse.Namespace(impls="ddp,ds,ds-mpi,ds-mpi-shm,deepspeed", stages=[0, 1])
    cases = bench_training.plan_cases(args, [0, 1])
    shm = [c for c in cases if c.get("collectives") == "shm"]
    assert [(c["stage"], c["launcher"]) for c in shm] == [(0, "mpirun"), (1, "mpirun")]
    assert bench_training.case_label({**shm[0], "world": 2}) == "ds mpirun shm stage 0"
    mpi = [c for c in cases if c.get("launcher") == "mpirun" and "collectives" not in c]
    assert [c["stage"] for c in mpi] == [0, 1] and all(c["impl"] == "ds" for c in mpi)
    spec = {**mpi[0], "world": 2}
    cmd = bench_training._case_command(spec, sys.executable)
    assert "--mpirun-case" in cmd and cmd[cmd.index("-np") + 1] == "2" and "--bind-to" in cmd
    assert bench_training.case_label(spec) == "ds mpirun stage 0"
    row = {"step_ms": 2.0, "ceiling_ms": 1.0, "overhead_spread_ms": [1, 1], "live_mib_after_backward": 1,
           "live_mib_after_step": 1, "peak_rss_mib": 1, "peak_rss_above_start_mib": 1, "numel": 10}  # fmt: skip
    rows = [
        {**row, "impl": "ddp", "stage": 0, "overhead_ms": 100.0},
        {**row, "impl": "ds", "stage": 0, "overhead_ms": 50.0},
        {**row, "impl": "ds", "stage": 0, "launcher": "mpirun", "overhead_ms": 25.0},
        {**row, "impl": "ds", "stage": 0, "launcher": "mpirun", "collectives": "shm", "overhead_ms": 20.0},
        {**row, "impl": "deepspeed", "stage": 0, "overhead_ms": 200.0},
    ]
    text = bench_training.table(rows, 2, "fp32", 2)
    assert "| ds mpirun | 0 |" in text and "0.12x" in text  # 25 / 200 against DeepSpeed
    assert "ds stage 0 overhead / DDP overhead: 0.50x" in text  # the mpirun row does not replace ds's
    assert "ds mpirun stage 0 overhead / DDP overhead: 0.25x" in text
    assert "ds mpirun shm stage 0 overhead / DDP overhead: 0.20x" in text

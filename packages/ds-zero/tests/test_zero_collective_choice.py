"""The per-backend collective choice (ds_zero/_comm.py), observed at 2 real gloo ranks.

Each worker trains the same model twice in one process: with both all_reduce alternatives forced on
(threshold 0 bytes for gloo) and with the native collectives (reduce per owner, all_gather). The test
sees which c10d ops ran (a TorchDispatchMode sees every real call) and that the weights are bitwise
identical. The shipped thresholds are checked through ``by_all_reduce`` on the real gloo group.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import _effects as e
import pytest
import torch
from ds_zero import ZeroOptimizer, ZeroOptions, _comm
from torch import nn


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _train(rank: int, stage: int, gather_bucket: int) -> tuple[dict, dict, dict]:
    """(reduce-phase calls, step-phase calls, weights) after 3 AdamW steps."""
    model = _model()
    opts = ZeroOptions(stage=stage, reduce_bucket_size=60, allgather_bucket_size=gather_bucket)
    zero = ZeroOptimizer(torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0), opts)
    reduce_calls: dict = {}
    step_calls: dict = {}
    for i in range(3):
        with e.Collectives() as seen:
            zero.backward(model(e._batch(rank + 7 * i)).square().mean())
            zero._reducer.flush()
        for k, v in seen.calls.items():
            reduce_calls[k] = reduce_calls.get(k, 0) + v
        with e.Collectives() as seen:
            zero.step()
        for k, v in seen.calls.items():
            step_calls[k] = step_calls.get(k, 0) + v
    return reduce_calls, step_calls, {k: v.clone() for k, v in model.state_dict().items()}


def _both(rank: int, world: int) -> dict:
    out = {}
    for stage in (1, 2):
        for gather_bucket in (10_000, 40):  # one gather bucket covering the partitions, or many chunks
            with _thresholds({"gloo": 0}):
                chosen = _train(rank, stage, gather_bucket)
            with _thresholds({}):
                native = _train(rank, stage, gather_bucket)
            out[(stage, gather_bucket)] = {"chosen": chosen, "native": native}
    with _thresholds({"gloo": 0}):
        out["signed_zeros"] = _gather_signed_zeros(rank, world)
    mib = 2**20
    out["shipped"] = {
        kind: [_comm.by_all_reduce(table, None, n) for n in (mib, 64 * mib)]
        for kind, table in (
            ("gather", _comm.ALL_GATHER_BY_ALL_REDUCE),
            ("reduce", _comm.REDUCE_SCATTER_BY_ALL_REDUCE),
        )
    }
    return out


@contextmanager
def _thresholds(table: dict[str, int]) -> Iterator[None]:
    """Both choice tables set to ``table`` (the module's own dicts, as _comm reads them)."""
    saved = (_comm.REDUCE_SCATTER_BY_ALL_REDUCE, _comm.ALL_GATHER_BY_ALL_REDUCE)
    _comm.REDUCE_SCATTER_BY_ALL_REDUCE, _comm.ALL_GATHER_BY_ALL_REDUCE = dict(table), dict(table)
    try:
        yield
    finally:
        _comm.REDUCE_SCATTER_BY_ALL_REDUCE, _comm.ALL_GATHER_BY_ALL_REDUCE = saved


def _gather_signed_zeros(rank: int, world: int) -> list[torch.Tensor]:
    """all_gather_views of slices holding -0.0, +0.0, inf and ordinary values, back to back and not."""
    mine = torch.tensor([-0.0, 0.0, float("inf"), -1.5 - rank, float("-inf"), 3e-45])
    flat = torch.full((world * 6,), 7.0)
    flat[rank * 6 : rank * 6 + 6] = mine
    _comm.all_gather_views(list(flat.chunk(world)), rank, None)  # back to back: gathered in place
    spaced = torch.full((world * 8,), 7.0)
    views = [spaced[r * 8 : r * 8 + 6] for r in range(world)]  # gaps between them: through a buffer
    views[rank].copy_(mine)
    _comm.all_gather_views(views, rank, None)
    return [flat, spaced]


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    from rank_testing import spawn

    return spawn(_both, 2, timeout_s=600)


def test_gloo_runs_the_chosen_collectives(runs):
    for r in runs:
        for (stage, _bucket), res in ((k, v) for k, v in r.items() if not isinstance(k, str)):
            (red, step, _), (nred, nstep, _) = res["chosen"], res["native"]
            # the norm's one small all_reduce per step is in the step phase either way
            assert "c10d.reduce_" not in red and red.get("c10d.allreduce_", 0) >= 3, (stage, red)
            assert nred.get("c10d.reduce_", 0) >= 3 * 2 and "c10d.allreduce_" not in nred, (stage, nred)
            assert "c10d.allgather_" not in step and step["c10d.allreduce_"] > 3, (stage, step)
            assert nstep.get("c10d.allgather_", 0) >= 3 and nstep["c10d.allreduce_"] == 3, (stage, nstep)


def test_results_are_bitwise_identical_to_the_native_collectives(runs):
    for r in runs:
        for key, res in ((k, v) for k, v in r.items() if not isinstance(k, str)):
            chosen, native = res["chosen"][2], res["native"][2]
            for name, value in chosen.items():
                assert torch.equal(value, native[name]), (key, name)
                # bit patterns too: torch.equal treats -0.0 == +0.0
                assert torch.equal(value.view(torch.int32), native[name].view(torch.int32)), (key, name)
    # the ranks agree
    for key in (k for k in runs[0] if not isinstance(k, str)):
        for name, value in runs[0][key]["chosen"][2].items():
            assert torch.equal(value, runs[1][key]["chosen"][2][name]), (key, name)


def test_the_all_reduce_gather_keeps_every_bit_including_negative_zero(runs):
    for rank_result in runs:
        flat, spaced = rank_result["signed_zeros"]
        for r in range(2):
            want = torch.tensor([-0.0, 0.0, float("inf"), -1.5 - r, float("-inf"), 3e-45])
            for got in (flat[r * 6 : r * 6 + 6], spaced[r * 8 : r * 8 + 6]):
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (r, got)
            assert torch.equal(spaced[r * 8 + 6 : r * 8 + 8], torch.full((2,), 7.0))  # gaps untouched


def test_gloo_gathers_large_buckets_by_all_reduce_and_reduces_per_owner(runs):
    """The shipped choice on gloo (measured): all_reduce for a 64 MiB gather, not a 1 MiB one; no
    reduce-scatter by all_reduce at any size."""
    for r in runs:
        assert r["shipped"] == {"gather": [False, True], "reduce": [False, False]}

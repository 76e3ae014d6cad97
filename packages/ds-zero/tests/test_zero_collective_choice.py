"""The per-backend collective choice (ds_zero/_comm.py), observed at 2 real gloo ranks.

Each worker trains the same model once per method, forced through the choice tables: gathers by
broadcast per owner, native all_gather and a -0.0 all_reduce; reductions by sending the owners their
slices, one reduce per owner and one all_reduce. The test sees which c10d ops ran (a TorchDispatchMode
sees every real call, point-to-point ones included) and that the weights are bitwise identical. The
shipped choice is checked through ``gather_method`` / ``reduce_method`` on the real gloo group.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import _effects as e
import pytest
import torch
from ds_zero import ZeroOptimizer, ZeroOptions, _comm
from ds_zero._transport import ENV
from torch import nn

METHODS = {"chosen": None, "reduce": ("all_gather", "reduce"), "all_reduce": ("all_reduce", "all_reduce")}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))


def _train(rank: int, stage: int, gather_bucket: int, contiguous: bool) -> dict:
    """The c10d calls, whether every send read a gradient's storage, and the weights after 3 AdamW steps."""
    model = _model()
    opts = ZeroOptions(
        stage=stage,
        reduce_bucket_size=60,
        allgather_bucket_size=gather_bucket,
        contiguous_gradients=contiguous,
    )
    grad_storages: set[int] = set()
    held: list[torch.UntypedStorage] = []  # kept alive: a freed gradient's address may be reused by a slot

    def seen_grad(q: torch.Tensor) -> None:
        grad_storages.add(q.grad.untyped_storage().data_ptr())
        held.append(q.grad.untyped_storage())

    for p in model.parameters():  # registered first, so they run before ZeRO's hooks take the gradients
        p.register_post_accumulate_grad_hook(seen_grad)
    zero = ZeroOptimizer(torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0), opts)
    calls: dict = {}
    sent_from: set[int] = set()
    watchers = []  # each holds the storages it saw sent, for the same reason
    for i in range(3):
        with e.Collectives() as seen:
            zero.backward(model(e._batch(rank + 7 * i)).square().mean())
            zero.step()
        for k, v in seen.calls.items():
            calls[k] = calls.get(k, 0) + v
        sent_from |= seen.sent_storages
        watchers.append(seen)
    return {
        "calls": calls,
        "sent_from_grads": bool(sent_from) and sent_from <= grad_storages,
        "weights": {k: v.clone() for k, v in model.state_dict().items()},
    }


def _all(rank: int, world: int) -> dict:
    os.environ[ENV] = "torch"  # gloo's own choice is under test: no host transport (_transport.py)
    out: dict = {}
    for stage in (1, 2):
        for gather_bucket in (10_000, 40):  # one gather bucket covering the partitions, or many chunks
            for contiguous in (False, True):
                runs = {}
                for name, forced in METHODS.items():
                    with _forced(forced):
                        runs[name] = _train(rank, stage, gather_bucket, contiguous)
                out[(stage, gather_bucket, contiguous)] = runs
    with _forced(("all_reduce", "all_reduce")):
        out["signed_zeros"] = _gather_signed_zeros(rank, world)
    mib = 2**20
    out["shipped"] = {
        "gather": [_comm.gather_method(None, n) for n in (mib, 64 * mib)],
        "reduce": [_comm.reduce_method(None, n) for n in (mib, 56 * mib, 57 * mib)],
        "reduce at 4 ranks": [_comm.REDUCE_CHOICE["gloo"](4, n) for n in (4 * mib, 5 * mib)],
        # gloo has neither send/recv nor reduce for CUDA tensors: any device but the CPU all-reduces
        "reduce off the CPU": [
            _comm.reduce_method(None, n, torch.device(d)) for n, d in ((mib, "cuda"), (mib, "cpu"))
        ],
    }
    return out


@contextmanager
def _forced(methods: tuple[str, str] | None) -> Iterator[None]:
    """Both choice tables answering ``(gather, reduce)`` for gloo (None: the shipped tables)."""
    saved = (_comm.GATHER_CHOICE, _comm.REDUCE_CHOICE)
    if methods is not None:
        gather, reduce = methods
        _comm.GATHER_CHOICE = {"gloo": lambda world, nbytes: gather}
        _comm.REDUCE_CHOICE = {"gloo": lambda world, nbytes: reduce}
    try:
        yield
    finally:
        _comm.GATHER_CHOICE, _comm.REDUCE_CHOICE = saved


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

    return spawn(_all, 2, timeout_s=600)


def _cases(r: dict):
    return ((k, v) for k, v in r.items() if not isinstance(k, str))


def test_gloo_runs_the_chosen_collectives(runs):
    for r in runs:
        for key, res in _cases(r):
            chosen, per_owner, all_reduce = (res[m]["calls"] for m in ("chosen", "reduce", "all_reduce"))
            # shipped on gloo: slices sent to their owners, weights broadcast by each owner; the norm's
            # one small all_reduce per step is there whatever the choice
            assert chosen.get("c10d.send", 0) >= 3 and chosen.get("c10d.recv_", 0) >= 3, key
            assert chosen.get("c10d.broadcast_", 0) >= 3 * 2 and chosen["c10d.allreduce_"] == 3, key
            assert not {"c10d.reduce_", "c10d.allgather_"} & set(chosen), key
            assert per_owner.get("c10d.reduce_", 0) >= 3 * 2 and per_owner.get("c10d.allgather_", 0) >= 3, key
            assert per_owner["c10d.allreduce_"] == 3 and not {"c10d.send", "c10d.broadcast_"} & set(per_owner)
            assert all_reduce["c10d.allreduce_"] > 3 * 2, key  # the norm's, the buckets' and the gathers'
            assert not {"c10d.send", "c10d.reduce_", "c10d.allgather_", "c10d.broadcast_"} & set(all_reduce)


def test_sends_go_straight_from_the_gradients_unless_contiguous_gradients_stages_them(runs):
    """Without contiguous_gradients nothing is flattened: every sent slice is a view of a ``.grad``. With
    it, stage 2 sends from its staging slots, and stage 1's ``.grad`` are views of its flat buffer."""
    for r in runs:
        for (stage, bucket, contiguous), res in _cases(r):
            want = not contiguous or stage == 1
            assert res["chosen"]["sent_from_grads"] is want, (stage, bucket, contiguous)


def test_results_are_bitwise_identical_whatever_the_collective(runs):
    for r in runs:
        for key, res in _cases(r):
            want = res["reduce"]["weights"]
            for method in ("chosen", "all_reduce"):
                for name, value in res[method]["weights"].items():
                    # bit patterns: torch.equal treats -0.0 == +0.0
                    assert torch.equal(value.view(torch.int32), want[name].view(torch.int32)), (
                        key,
                        method,
                        name,
                    )
    for key, _ in _cases(runs[0]):  # the ranks agree
        for name, value in runs[0][key]["chosen"]["weights"].items():
            assert torch.equal(value, runs[1][key]["chosen"]["weights"][name]), (key, name)


def test_the_all_reduce_gather_keeps_every_bit_including_negative_zero(runs):
    for rank_result in runs:
        flat, spaced = rank_result["signed_zeros"]
        for r in range(2):
            want = torch.tensor([-0.0, 0.0, float("inf"), -1.5 - r, float("-inf"), 3e-45])
            for got in (flat[r * 6 : r * 6 + 6], spaced[r * 8 : r * 8 + 6]):
                assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (r, got)
            assert torch.equal(spaced[r * 8 + 6 : r * 8 + 8], torch.full((2,), 7.0))  # gaps untouched


def test_the_shipped_gloo_choice(runs):
    """Measured (tools/bench/bench_zero_collectives.py; git show af730fc:docs/benchmarks/ds-zero.md): broadcasts gather at every size; 2 ranks send slices to
    their owners up to 56 MiB (the receive buffer is bounded), 4 ranks up to 4 MiB, and reduce per
    owner above. With CUDA tensors (gloo on a GPU) it all-reduces: gloo has no send/recv or reduce there."""
    for r in runs:
        assert r["shipped"] == {
            "gather": ["broadcast", "broadcast"],
            "reduce": ["send", "send", "reduce"],
            "reduce at 4 ranks": ["send", "reduce"],
            "reduce off the CPU": ["all_reduce", "send"],
        }

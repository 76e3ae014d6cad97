"""Two real gloo ranks: ``step()`` refuses gradients that no ``engine.backward(loss)`` produced (a direct
``loss.backward()``), at ZeRO 0-3, where stepping would apply each rank's own, unaveraged gradients and the
ranks' weights would silently diverge. DeepSpeed 0.19.8 (recorded by
tools/make_deepspeed_manual_backward_fixtures.py) refuses that backward at ZeRO 0 and reduces it at 1-3;
ds raises at every stage. The legitimate paths (accumulation, no_sync, no gradients at all, unused
parameters, another backward's gradients cleared, activation checkpointing) still step, in one launch."""

from __future__ import annotations

import json
from pathlib import Path

import ds_engine
import pytest
import torch
from rank_testing import spawn

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_manual_backward.json").read_text())
STAGES = (0, 1, 2, 3)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.unused = torch.nn.Linear(2, 2)  # never in forward: no gradient, ever

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _engine(stage: int, gas: int = 1):
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    return ds_engine.initialize(model=Net(), config=config)[0]


def _weights(engine, stage: int) -> list[list[float]]:
    params = list(engine.module.body.parameters())
    with ds_engine.zero.GatheredParameters(params, enabled=stage == 3):
        return [p.detach().flatten().tolist() for p in params]


def _loss(engine, rank: int, micro: int = 0) -> torch.Tensor:
    return engine(torch.full((2, 4), float(rank + 1 + micro))).pow(2).mean()  # each rank its own data


def _attempt(fn) -> dict:
    try:
        return {"weights": fn()}
    except Exception as exc:  # noqa: BLE001 - the test reads it
        return {"error": f"{type(exc).__name__}: {exc}"}


def _stage_scenarios(rank: int, stage: int) -> dict:
    out = {}

    def direct():
        e = _engine(stage)
        _loss(e, rank).backward()
        e.step()
        return _weights(e, stage)

    def after_engine_backward():  # the engine's backward, then one of the script's on top of it
        e = _engine(stage)
        e.backward(_loss(e, rank))
        _loss(e, rank, 1).backward()
        e.step()
        return _weights(e, stage)

    def engine_backward():
        e = _engine(stage)
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def accumulation():  # backward twice, the second step() is the boundary
        e = _engine(stage, gas=2)
        for micro in range(2):
            e.backward(_loss(e, rank, micro))
            e.step()
        return _weights(e, stage)

    def no_gradients():  # a step with no backward at all, then a normal one
        e = _engine(stage)
        e.step()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def others_cleared():  # another backward's gradients (a GAN's generator pass), cleared before ours
        e = _engine(stage)
        _loss(e, rank, 2).backward()
        e.zero_grad()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def before_engine_backward(gas: int):  # the script's backward, then the engine's on top of it
        e = _engine(stage, gas)
        for micro in range(gas):
            _loss(e, rank, 2).backward()
            e.backward(_loss(e, rank, micro))
            e.step()
        return _weights(e, stage)

    out["direct"] = _attempt(direct)
    out["before_engine_backward"] = _attempt(lambda: before_engine_backward(1))
    out["before_engine_backward_gas2"] = _attempt(lambda: before_engine_backward(2))
    out["after_engine_backward"] = _attempt(after_engine_backward)
    for name, fn in (
        ("engine_backward", engine_backward),
        ("accumulation", accumulation),
        ("no_gradients", no_gradients),
        ("others_cleared", others_cleared),
    ):
        out[name] = _attempt(fn)
    return out


def _below_stage_2(rank: int) -> dict:
    out = {}

    def no_sync():
        e = _engine(1, gas=2)
        with e.no_sync():
            e.backward(_loss(e, rank))
        e.step()
        e.backward(_loss(e, rank, 1))
        e.step()
        return _weights(e, 1)

    def module_zero_grad():  # cleared by the module itself (set_to_none), not the engine
        e = _engine(0)
        _loss(e, rank, 2).backward()
        e.module.zero_grad()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, 0)

    def checkpointed():  # activation checkpointing re-runs forward and backward inside engine.backward
        e = _engine(0)
        x = torch.full((2, 4), float(rank + 1), requires_grad=True)
        e.backward(ds_engine.checkpointing.checkpoint(e.module.body, x).pow(2).mean())
        e.step()
        return _weights(e, 0)

    for name, fn in (
        ("no_sync", no_sync),
        ("module_zero_grad", module_zero_grad),
        ("checkpointed", checkpointed),
    ):
        out[name] = _attempt(fn)
    return out


def _all(rank: int, world: int) -> dict:
    return {"stages": {s: _stage_scenarios(rank, s) for s in STAGES}, "misc": _below_stage_2(rank)}


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    return spawn(_all, 2)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("way", ["direct", "after_engine_backward"])
def test_step_refuses_gradients_from_a_direct_backward(ranks, stage, way):
    for r in ranks:
        error = r["stages"][stage][way].get("error", "")
        assert error.startswith("OutsideGradientError: gradients were produced outside engine.backward(loss)")
        assert "Call engine.backward(loss) instead of loss.backward()" in error and "body.0.weight" in error


@pytest.mark.parametrize("stage", STAGES)
def test_an_earlier_backward_is_reduced_along_only_where_nothing_scales_it(ranks, stage):
    """A GAN's generator pass leaves gradients in the discriminator before its backward: at ZeRO 0-2 they
    add into it and are averaged with it (the ranks agree); with gradient accumulation they would miss the
    1/GAS, and at ZeRO 3 its hooks took them out of .grad: refused."""
    got = [r["stages"][stage]["before_engine_backward"] for r in ranks]
    if stage == 3:
        assert all(g.get("error", "").startswith("OutsideGradientError") for g in got), got
    else:
        assert "error" not in got[0] and got[0]["weights"] == got[1]["weights"], got
    for r in ranks:
        assert r["stages"][stage]["before_engine_backward_gas2"]["error"].startswith("OutsideGradientError")


@pytest.mark.parametrize("stage", STAGES)
def test_deepspeed_never_steps_a_direct_backward_unreduced(stage):
    """What ds refuses, DeepSpeed either refuses (ZeRO 0) or reduces (1-3): the ranks agree, and match its
    engine.backward. ds's refusal is the loud side of that difference, never a silent one."""
    r0, r1 = RECORD["rank0"][str(stage)], RECORD["rank1"][str(stage)]
    if stage == 0:
        assert "Direct calls to tensor.backward() are not supported" in r0["loss_backward"]["error"]
        return
    assert r0["loss_backward"]["weights"] == r1["loss_backward"]["weights"]
    for a, b in zip(r0["loss_backward"]["weights"], r0["engine_backward"]["weights"], strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("way", ["engine_backward", "accumulation", "no_gradients", "others_cleared"])
def test_legitimate_paths_still_step_alike_on_both_ranks(ranks, stage, way):
    got = [r["stages"][stage][way] for r in ranks]
    assert "error" not in got[0] and "error" not in got[1], got
    assert got[0]["weights"] == got[1]["weights"]
    if way == "engine_backward":  # DeepSpeed's weights for the same step
        rec = RECORD["rank0"][str(stage)]["engine_backward"]["weights"]
        for a, b in zip(got[0]["weights"], rec, strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


@pytest.mark.parametrize("way", ["no_sync", "module_zero_grad", "checkpointed"])
def test_no_sync_cleared_and_checkpointed_backwards_still_step(ranks, way):
    got = [r["misc"][way] for r in ranks]
    assert "error" not in got[0] and "error" not in got[1], got
    assert got[0]["weights"] == got[1]["weights"]

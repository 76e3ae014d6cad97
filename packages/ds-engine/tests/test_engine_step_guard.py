"""Two real gloo ranks: ``step()`` refuses gradients that no ``engine.backward(loss)`` produced (a direct
``loss.backward()``), at ZeRO 0-3, where stepping would apply each rank's own, unaveraged gradients and the
ranks' weights would silently diverge. DeepSpeed 0.19.8 (recorded by
tools/fixtures/make_deepspeed_manual_backward_fixtures.py) refuses that backward at ZeRO 0 and reduces it at 1-3;
ds raises at every stage. The legitimate paths (accumulation, no_sync, no gradients at all, unused
parameters, another backward's gradients cleared, activation checkpointing) still step. The ranks run in test_dropin_ranks.py's launch (the ``ranks`` fixture, conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _step_guard_workers import STAGES, WHERE

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_manual_backward.json").read_text())


@pytest.mark.parametrize(
    ("way", "stage"), [(w, s) for w in ("direct", "after_engine_backward") for s in WHERE[w]]
)
def test_step_refuses_gradients_from_a_direct_backward(ranks, stage, way):
    for r in ranks[0]:
        error = r["step_guard"]["stages"][stage][way].get("error", "")
        assert error.startswith("OutsideGradientError: gradients were produced outside engine.backward(loss)")
        assert "Call engine.backward(loss) instead of loss.backward()" in error and "body.0.weight" in error


def test_an_earlier_backward_is_reduced_along_only_where_nothing_scales_it(ranks):
    """A GAN's generator pass leaves gradients in the discriminator before its backward: at ZeRO 0-2 they
    add into it and are averaged with it (the ranks agree; integration/test_zero_outside_backward.py trains
    so at 0-2); with gradient accumulation they would miss the 1/GAS, and at ZeRO 3 its hooks took them out
    of .grad: refused."""
    at = {s: [r["step_guard"]["stages"][s] for r in ranks[0]] for s in STAGES}
    assert "error" not in at[0][0]["before_engine_backward"]
    assert at[0][0]["before_engine_backward"]["weights"] == at[0][1]["before_engine_backward"]["weights"]
    for got in at[3]:
        assert got["before_engine_backward"]["error"].startswith("OutsideGradientError")
    for got in at[2]:
        assert got["before_engine_backward_gas2"]["error"].startswith("OutsideGradientError")


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


@pytest.mark.parametrize(
    ("way", "stage"),
    [(w, s) for w in ("engine_backward", "accumulation", "no_gradients", "others_cleared") for s in WHERE[w]],
)
def test_legitimate_paths_still_step_alike_on_both_ranks(ranks, stage, way):
    got = [r["step_guard"]["stages"][stage][way] for r in ranks[0]]
    assert "error" not in got[0] and "error" not in got[1], got
    assert got[0]["weights"] == got[1]["weights"]
    if way == "engine_backward":  # DeepSpeed's weights for the same step
        rec = RECORD["rank0"][str(stage)]["engine_backward"]["weights"]
        for a, b in zip(got[0]["weights"], rec, strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


@pytest.mark.parametrize("way", ["no_sync", "module_zero_grad", "checkpointed"])
def test_no_sync_cleared_and_checkpointed_backwards_still_step(ranks, way):
    got = [r["step_guard"]["misc"][way] for r in ranks[0]]
    assert "error" not in got[0] and "error" not in got[1], got
    assert got[0]["weights"] == got[1]["weights"]

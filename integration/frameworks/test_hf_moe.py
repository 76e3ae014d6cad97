"""Hugging Face MoE models under ds's ZeRO-3 with leaf modules, ranks' tokens routed to different experts:
they finish, with ZeRO-2's losses. Mixtral through an unmodified ``Trainer`` (its leaf modules from the
defaults of ``zero_optimization.leaf_module``, as under DeepSpeed 0.19.8: nothing marks them but the engine)
and through Accelerate's ``transformer_moe_cls_names``; Qwen3-MoE and DeepSeek-V3 through
``set_z3_leaf_modules``: these three with the section's defaults off in the config, so their leaves are the
marking's (Qwen3-MoE is a default too). The Trainer's 2-rank ZeRO-3 losses also equal DeepSpeed 0.19.8's
(fixtures/hf_moe.json, recorded by tools/fixtures/make_framework_fixtures.py).

Each case runs at the session's world size (``DS_TEST_WORLD_SIZE``, 2 by default and in CI); the 4-rank
cases: ``DS_TEST_WORLD_SIZE=4 ./dev -s frameworks -- -k test_hf_moe``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from launch import HERE, run_script

pytest.importorskip("accelerate")

MODELS = ("mixtral_trainer", "mixtral", "qwen3_moe", "deepseek_v3")
REL_TOL = 1e-5
STEPS = 3
SESSION_RANKS = int(os.environ.get("DS_TEST_WORLD_SIZE", "2"))
RANKS = [
    pytest.param(n, marks=pytest.mark.skipif(n != SESSION_RANKS, reason=f"runs in the {n}-rank session"))
    for n in (2, 4)
]
FIXTURE = json.loads((HERE / "fixtures" / "hf_moe.json").read_text())

_runs: dict[tuple[int, int], list[dict] | Exception] = {}


def run(ranks: int, stage: int) -> list[dict]:
    """One launch per world size and stage runs every model (the module's tests share it; a failed launch
    is not repeated for each test)."""
    if (ranks, stage) not in _runs:
        try:
            _runs[ranks, stage] = run_script(
                sys.executable, "hf_moe_script.py", "--stage", str(stage), "--steps", str(STEPS),
                # no --moe-env: the Trainer's leaves come from the leaf_module defaults alone
                "--models", ",".join(MODELS), nproc=ranks,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 (raised again below, once per test)
            _runs[ranks, stage] = e
    found = _runs[ranks, stage]
    if isinstance(found, Exception):
        raise found
    return found


def records(ranks: int, stage: int, model: str, key: str) -> list:
    return [r[key] for r in run(ranks, stage) if r.get("model") == model and key in r]


@pytest.mark.parametrize("ranks", RANKS)
@pytest.mark.parametrize("model", MODELS)
def test_zero3_with_leaf_modules_matches_zero2(ranks, model):
    z2, z3 = records(ranks, 2, model, "loss"), records(ranks, 3, model, "loss")
    assert len(z3) == STEPS and len(z2) == STEPS, (z3, z2)
    worst = max(abs(a - b) / abs(b) for a, b in zip(z3, z2))
    assert worst <= REL_TOL, f"{model} at {ranks} ranks: ZeRO-3 {z3}, ZeRO-2 {z2}"
    # stage 3 took the MoE blocks as leaves: their parameters carry DeepSpeed's ds_z3_leaf_module
    (leaves,) = records(ranks, 3, model, "leaf_modules")
    (leaf_params,) = records(ranks, 3, model, "leaf_params")
    assert leaves > 0 and leaf_params > 0, f"{model}: {leaves} leaf modules, {leaf_params} leaf parameters"


@pytest.mark.parametrize("ranks", RANKS)
def test_trainer_gathers_each_moe_block_whole_once_a_pass(ranks):
    """Through a plain Trainer (no MoE class named anywhere: the leaf_module defaults), each MoE block's
    parameters are gathered in one piece, once in the forward and once in the backward (without leaf
    modules: the router and the experts apart, 10 gathers a step), while the ranks send their tokens to
    different experts."""
    (routed,) = records(ranks, 3, "mixtral_trainer", "routed")  # [rank][block][expert] tokens, first step
    assert len(routed) == ranks and any(r != routed[0] for r in routed[1:]), routed
    (gathers,) = records(ranks, 3, "mixtral_trainer", "block_gathers")
    (blocks,) = records(ranks, 3, "mixtral_trainer", "blocks")
    assert gathers == [{"gathers": 2 * blocks, "blocks": 2 * blocks, "whole": True}] * STEPS, gathers


@pytest.mark.skipif(SESSION_RANKS != 2, reason="recorded at 2 ranks: runs in the 2-rank session")
def test_trainer_zero3_losses_match_deepspeed():
    """The 2-rank session's stage-3 launch (its Trainer run comes first) against DeepSpeed 0.19.8's."""
    recorded = FIXTURE["cases"]["mixtral_trainer_zero3"]
    assert FIXTURE["deepspeed_version"] == "0.19.8" and recorded["ranks"] == 2
    ours = records(2, 3, "mixtral_trainer", "loss")
    assert len(ours) == len(recorded["losses"]) == STEPS, (ours, recorded["losses"])
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, recorded["losses"]))
    assert worst <= REL_TOL, f"ds {ours}, DeepSpeed 0.19.8 {recorded['losses']}"

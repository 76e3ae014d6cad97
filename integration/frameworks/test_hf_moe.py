"""Hugging Face MoE models (Mixtral through Accelerate's ``transformer_moe_cls_names``, Qwen3-MoE and
DeepSeek-V3 through ``set_z3_leaf_modules``) under ds's ZeRO-3 with leaf modules at 2 ranks whose tokens
route to different experts: they finish, with ZeRO-2's losses."""

from __future__ import annotations

import sys

import pytest
from launch import run_script

pytest.importorskip("accelerate")

MODELS = ("mixtral", "qwen3_moe", "deepseek_v3")
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict]]:
    return {stage: run_script(sys.executable, "hf_moe_script.py", "--stage", str(stage)) for stage in (2, 3)}


@pytest.mark.parametrize("model", MODELS)
def test_zero3_with_leaf_modules_matches_zero2(runs, model):
    def losses(stage: int) -> list[float]:
        return [r["loss"] for r in runs[stage] if r.get("model") == model and "loss" in r]

    z2, z3 = losses(2), losses(3)
    assert len(z3) == 3 and len(z2) == 3, runs
    worst = max(abs(a - b) / abs(b) for a, b in zip(z3, z2))
    assert worst <= REL_TOL, f"{model}: ZeRO-3 {z3}, ZeRO-2 {z2}"
    leaves = [r["leaf_modules"] for r in runs[3] if r.get("model") == model and "leaf_modules" in r]
    assert leaves and leaves[0] > 0, "the MoE blocks are leaf modules"

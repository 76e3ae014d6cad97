"""Hugging Face Trainer with DeepSpeed sequence parallelism (ALST) through Accelerate's
``ParallelismConfig(sp_size=2, sp_backend="deepspeed")``, unmodified, on ds's ``deepspeed`` at 2 ranks: the step
losses equal DeepSpeed 0.19.8's (recorded by tools/fixtures/make_framework_fixtures.py from trainer_sp_script.py),
at ZeRO 2 and ZeRO 3 (where transformers rescales the loss for DeepSpeed < 0.20.2's averaged gradients)."""

from __future__ import annotations

import json
import sys

import pytest
from launch import HERE, losses, run_script

pytest.importorskip("transformers")
pytest.importorskip("accelerate.parallelism_config")

FIXTURE = json.loads((HERE / "fixtures" / "trainer.json").read_text())


@pytest.mark.parametrize("case", ["sp2_zero2", "sp2_zero3"])
def test_sequence_parallel_trainer_losses_match_deepspeed(case, tmp_path):
    recorded = FIXTURE["cases"][case]
    assert recorded["script"] == "trainer_sp_script.py"
    records = run_script(
        sys.executable, recorded["script"], *recorded["args"], "--out", str(tmp_path), nproc=2
    )
    ours, theirs = losses(records), recorded["losses"]
    assert len(ours) == len(theirs) == 6
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    assert worst <= 1e-5, (
        f"Trainer {case}: max relative difference {worst:.2e}\nds: {ours}\nDeepSpeed: {theirs}"
    )

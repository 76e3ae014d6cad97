"""Gradients that reach a ZeRO engine's parameters outside its own backward (two-engine GAN, issue 14).

The script always runs on 2 ranks, so these tests run only in the 2-rank session (the others would repeat
them), and all the tests' runs share one launch (a launch costs more than its runs).
"""

from __future__ import annotations

import pytest
import torch

from conftest import launch, read_json, world_size

pytestmark = pytest.mark.skipif(
    world_size() != 2, reason="a fixed 2-rank job: run in the 2-rank session only"
)


MODES = ["zero_grad", "accumulate"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every run of this file, keyed ``STAGE:MODE``; the refused ("late") ones last."""
    out = tmp_path_factory.mktemp("gan") / "gan.json"
    wanted = [f"{stage}:{mode}" for mode in MODES for stage in (0, 1, 2)] + [f"{s}:late" for s in (0, 1, 2)]
    launch("gan_two_engines.py", str(out), *wanted, num_procs=2)
    return read_json(out)


@pytest.mark.parametrize("mode", MODES)
def test_gan_at_stages_1_and_2_trains_like_stage_0(runs, mode):
    base = runs[f"0:{mode}"]
    assert base["error"] is None
    for stage in (1, 2):
        run = runs[f"{stage}:{mode}"]
        assert run["error"] is None, (stage, run["error"])
        for key, value in base["weights"].items():
            got = torch.tensor(run["weights"][key])
            assert torch.allclose(got, torch.tensor(value), atol=1e-5, rtol=1e-5), (stage, mode, key)


def test_gradients_after_the_last_backward_are_refused_by_name(runs):
    """The engine's step() refuses them at every stage (stage 0 used to apply them to each rank unaveraged)."""
    for stage in (0, 1, 2):
        run = runs[f"{stage}:late"]
        assert run["error"] is not None and "OutsideGradientError" in run["error"], (stage, run["error"])
        assert "0.weight" in run["error"] and "zero_grad()" in run["error"], run["error"]

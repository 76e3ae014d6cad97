"""Gradients that reach a ZeRO engine's parameters outside its own backward (two-engine GAN, issue 14).

The script always runs on 2 ranks, so these tests run only in the 2-rank session (the others would repeat
them), and each test's runs share one launch.
"""

from __future__ import annotations

import pytest
import torch

from conftest import launch, read_json, world_size

pytestmark = pytest.mark.skipif(
    world_size() != 2, reason="a fixed 2-rank job: run in the 2-rank session only"
)


def _run(tmp_path, *runs: str) -> dict:
    out = tmp_path / "gan.json"
    launch("gan_two_engines.py", str(out), *runs, num_procs=2)
    return read_json(out)


@pytest.mark.parametrize("mode", ["zero_grad", "accumulate"])
def test_gan_at_stages_1_and_2_trains_like_stage_0(tmp_path, mode):
    runs = _run(tmp_path, *(f"{stage}:{mode}" for stage in (0, 1, 2)))
    base = runs[f"0:{mode}"]
    assert base["error"] is None
    for stage in (1, 2):
        run = runs[f"{stage}:{mode}"]
        assert run["error"] is None, (stage, run["error"])
        for key, value in base["weights"].items():
            got = torch.tensor(run["weights"][key])
            assert torch.allclose(got, torch.tensor(value), atol=1e-5, rtol=1e-5), (stage, mode, key)


def test_gradients_after_the_last_backward_are_refused_by_name(tmp_path):
    runs = _run(tmp_path, "1:late", "2:late")
    for stage in (1, 2):
        run = runs[f"{stage}:late"]
        assert run["error"] is not None and "ZeroConfigError" in run["error"], (stage, run["error"])
        assert "0.weight" in run["error"] and "zero_grad()" in run["error"], run["error"]

"""Gradients that reach a ZeRO engine's parameters outside its own backward (two-engine GAN, issue 14)."""

from __future__ import annotations

import pytest
import torch

from conftest import launch, read_json


def _run(tmp_path, stage: int, mode: str) -> dict:
    out = tmp_path / f"gan-{stage}-{mode}.json"
    launch("gan_two_engines.py", str(out), str(stage), mode, num_procs=2)
    return read_json(out)


@pytest.mark.parametrize("mode", ["zero_grad", "accumulate"])
def test_gan_at_stages_1_and_2_trains_like_stage_0(tmp_path, mode):
    base = _run(tmp_path, 0, mode)
    assert base["error"] is None
    for stage in (1, 2):
        run = _run(tmp_path, stage, mode)
        assert run["error"] is None, (stage, run["error"])
        for key, value in base["weights"].items():
            got = torch.tensor(run["weights"][key])
            assert torch.allclose(got, torch.tensor(value), atol=1e-5, rtol=1e-5), (stage, mode, key)


def test_gradients_after_the_last_backward_are_refused_by_name(tmp_path):
    for stage in (1, 2):
        run = _run(tmp_path, stage, "late")
        assert run["error"] is not None and "ZeroConfigError" in run["error"], (stage, run["error"])
        assert "0.weight" in run["error"] and "zero_grad()" in run["error"], run["error"]

"""``deepspeed.initialize`` applies DeepSpeed 0.19.8's defaults where they differ from ds's own."""

from __future__ import annotations

import json

import deepspeed
import pytest
import torch

CFG = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


@pytest.mark.parametrize(
    "given, expected", [({}, 1.0), ({"gradient_clipping": 0.0}, 0.0), ({"gradient_clipping": 0.5}, 0.5)]
)
def test_gradient_clipping_defaults_to_deepspeed_019s(given, expected):
    """0.19 clips to 1.0 when the config is silent (the Trainer's and Accelerate's usual configs are)."""
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config={**CFG, **given})
    assert engine.gradient_clipping() == expected


def test_default_reaches_a_config_given_as_a_path(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CFG))
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=str(path))
    assert engine.gradient_clipping() == 1.0

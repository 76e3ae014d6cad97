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


@pytest.mark.parametrize(
    "fp16, expected", [({"enabled": True}, 2.0**16), ({"enabled": True, "initial_scale_power": 8}, 2.0**8)]
)
def test_fp16_loss_scale_starts_at_deepspeed_019s(fp16, expected):
    """0.19 starts the dynamic loss scale at 2**16 (ds_engine, following the config reference, at 2**32)."""
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config={**CFG, "fp16": fp16})
    assert engine.optimizer.loss_scale == expected


def test_ds_engine_keeps_its_own_defaults():
    import ds_engine

    engine, *_ = ds_engine.initialize(model=torch.nn.Linear(4, 2), config={**CFG, "fp16": {"enabled": True}})
    assert engine.gradient_clipping() == 0.0 and engine.optimizer.loss_scale == 2.0**32


def test_a_section_default_adds_no_section():
    """The fp16 default fills an fp16 section the config has; it does not turn fp16 on in one without."""
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=CFG)
    assert not engine.fp16_enabled()


@pytest.mark.parametrize(("stage", "expected"), [(2, False), (3, True)])
def test_overlap_comm_defaults_to_true_at_stage_3_as_deepspeed_019(stage, expected):
    """DeepSpeed 0.19.8's ZeRO model decides overlap_comm by stage when the config leaves it out."""
    config = {**CFG, "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=config)
    assert engine.ds_config.zero_optimization.overlap_comm is expected
    explicit = {**CFG, "zero_optimization": {"stage": stage, "overlap_comm": not expected}}
    engine, *_ = deepspeed.initialize(model=torch.nn.Linear(4, 2), config=explicit)
    assert engine.ds_config.zero_optimization.overlap_comm is (not expected)

"""fp16 with a client AdamW, and the loss scaler reached as DeepSpeed code reaches it, at ZeRO 0, 1 and 2.

At ZeRO 1/2, DeepSpeed 0.19.8 refuses fp16 on the CPU, so no fixture records its values: they are checked
against the config as DeepSpeed's ``DynamicLossScaler`` defines them (``cur_scale`` = 2**initial_scale_power;
the scale halves once ``hysteresis`` overflows have been seen; ``scale_factor`` 2.0). ZeRO's optimizer holds
``loss_scaler`` (the scaler itself), ``cur_scale`` (read and set through it), ``dynamic_loss_scale`` and
``loss_scale_config`` (a snapshot under DeepSpeed's field names). One rank, a 36-parameter model.

At stage 0 the fixture tool records DeepSpeed's ``optimizer.loss_scale_config`` step by step (its CPU fp16
check lifted for that case; ``fixtures/deepspeed_compat.json``, "fp16_stage0", from
``tools/fixtures/deepspeed_compat_cases.py``, which runs here under ds).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import deepspeed
import pytest
import torch

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_compat.json").read_text())["fp16_stage0"]
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools/fixtures"))
import deepspeed_compat_cases as recorder  # noqa: E402


def _engine(stage: int, fp16: dict):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {"train_batch_size": 1, "fp16": {"enabled": True, **fp16}, "zero_optimization": {"stage": stage}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def _step(engine, value: float) -> None:
    x = torch.full((1, 8), value, dtype=torch.float16)
    loss = engine(x).float().sum()
    engine.backward(loss)
    engine.step()


@pytest.mark.parametrize("stage", [1, 2])
def test_dynamic_loss_scaler_under_zero_with_a_client_adamw(stage):
    engine = _engine(stage, {"initial_scale_power": 8, "hysteresis": 2, "loss_scale_window": 100})
    opt = engine.optimizer
    scaler = opt.loss_scaler
    assert (scaler.cur_scale, opt.cur_scale, scaler.dynamic, opt.dynamic_loss_scale) == (
        256.0,
        256.0,
        True,
        True,
    )
    assert (scaler.delayed_shift, scaler.cur_hysteresis, scaler.scale_window) == (2, 2, 100)
    assert (scaler.min_scale, scaler.scale_factor, scaler.cur_iter, scaler.last_overflow_iter) == (
        1.0,
        2.0,
        0,
        -1,
    )
    cfg = opt.loss_scale_config
    assert (cfg.use_grad_scaling, cfg.dynamic_loss_scale, cfg.cur_scale, cfg.scale_factor) == (
        True,
        True,
        256.0,
        2.0,
    )
    assert (cfg.scale_window, cfg.min_loss_scale, cfg.cur_iter, cfg.last_overflow_iter) == (100, 1.0, 0, -1)

    before = [p.detach().clone() for p in engine.module.parameters()]
    _step(engine, math.inf)  # first overflow: hysteresis absorbs it, the scale stays
    assert (opt.cur_scale, scaler.cur_hysteresis, scaler.last_overflow_iter) == (256.0, 1, 0)
    _step(engine, math.inf)  # second overflow: the scale halves
    assert (opt.cur_scale, scaler.cur_scale, opt.loss_scale_config.cur_scale) == (128.0, 128.0, 128.0)
    assert all(torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))  # both steps skipped
    _step(engine, 0.5)  # a clean step updates the weights and keeps the scale
    assert (opt.cur_scale, scaler.cur_iter, opt.loss_scale_config.last_overflow_iter) == (128.0, 3, 1)
    assert not all(torch.equal(a, p) for a, p in zip(before, engine.module.parameters()))

    opt.cur_scale = 64.0  # DeepSpeed's cur_scale setter writes through to the scaler
    assert (scaler.cur_scale, opt.loss_scale_config.cur_scale) == (64.0, 64.0)


def test_static_loss_scale_under_zero():
    opt = _engine(2, {"loss_scale": 128}).optimizer
    assert (opt.loss_scaler.cur_scale, opt.cur_scale, opt.loss_scaler.dynamic, opt.dynamic_loss_scale) == (
        128.0,
        128.0,
        False,
        False,
    )
    cfg = opt.loss_scale_config
    assert (cfg.use_grad_scaling, cfg.dynamic_loss_scale, cfg.cur_scale) == (True, False, 128.0)


def test_loss_scale_config_at_stage_0_as_deepspeed_0_19_8():
    got = json.loads(json.dumps(recorder.fp16_stage0_case()))
    for name in ("dynamic.hysteresis=1", "static"):  # after initialize, then overflow x2, clean x4
        assert "error" not in got[name], got[name]
        assert got[name]["has"]["loss_scale_config"] is RECORD[name]["has"]["loss_scale_config"] is True
        assert got[name]["trace"] == RECORD[name]["trace"], name
    # deliberate difference (docs/deepspeed-api.md): DeepSpeed's stage-0 fp16 optimizers ignore hysteresis,
    # ds's one loss scaler honours it at every stage
    want, mine = RECORD["dynamic.hysteresis=2"]["trace"], got["dynamic.hysteresis=2"]["trace"]
    assert mine[0] == want[0]
    assert [t["cur_scale"] for t in want] == [256, 128, 64, 64, 64, 128, 128]
    assert [t["cur_scale"] for t in mine] == [256, 256, 128, 128, 128, 256, 256]

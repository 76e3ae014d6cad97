"""fp16 under ZeRO 1/2 with a client AdamW, and the loss scaler reached as DeepSpeed code reaches it.

DeepSpeed 0.19.8 refuses fp16 on the CPU, so no fixture records its values: they are checked against the
config as DeepSpeed's ``DynamicLossScaler`` defines them (``cur_scale`` = 2**initial_scale_power; the
scale halves once ``hysteresis`` overflows have been seen; ``scale_factor`` 2.0). ZeRO's optimizer holds
``loss_scaler`` (the scaler itself), ``cur_scale`` (read and set through it), ``dynamic_loss_scale`` and
``loss_scale_config`` (a snapshot under DeepSpeed's field names). One rank, a 36-parameter model.
"""

from __future__ import annotations

import math

import deepspeed
import pytest
import torch


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

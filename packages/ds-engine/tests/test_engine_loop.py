"""The engine's loop semantics: accumulation boundaries, skipped steps, logging keys, checkpoints."""

from __future__ import annotations

import logging

import ds_engine
import pytest
import torch
from ds_checkpoint import activation


def net(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def cfg(**extra):
    return {
        "train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "steps_per_print": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
        **extra,
    }


def train(engine, micro_steps: int, poison: set[int] = frozenset()):
    torch.manual_seed(1)
    for i in range(micro_steps):
        x = torch.randn(2, 4, dtype=engine.parts.dtype)
        loss = engine(x).float().pow(2).mean()
        if i in poison:
            loss = loss * float("inf")
        engine.backward(loss)
        engine.step()


def test_optimizer_acts_only_at_boundaries():
    engine, *_ = ds_engine.initialize(model=net(), config=cfg())
    before = [p.detach().clone() for p in engine.module.parameters()]
    flags = []
    for _ in range(3):
        flags.append(engine.is_gradient_accumulation_boundary())
        train(engine, 1)
    assert flags == [False, False, False]
    assert all(torch.equal(a, b) for a, b in zip(before, engine.module.parameters()))
    assert engine.is_gradient_accumulation_boundary()
    train(engine, 1)
    assert engine.global_steps == 1 and engine.global_samples == 8 and engine.micro_steps == 4


def test_fp16_overflow_skips_step_and_lr_schedule():
    engine, *_ = ds_engine.initialize(
        model=net(),
        config=cfg(
            train_batch_size=2,
            gradient_accumulation_steps=1,
            fp16={"enabled": True, "initial_scale_power": 8, "hysteresis": 1},
        ),
    )
    train(engine, 2)
    lr_before, scale_before = engine.get_lr(), engine.loss_scale
    weights = [p.detach().clone() for p in engine.module.parameters()]
    train(engine, 1, poison={0})
    assert engine.skipped_steps == 1 and engine.global_steps == 3
    assert engine.get_lr() == lr_before, "a skipped step must not step the LR schedule"
    assert engine.loss_scale == scale_before / 2
    assert all(torch.equal(a, b) for a, b in zip(weights, engine.module.parameters()))


def test_steps_per_print_and_wall_clock_breakdown(caplog):
    engine, *_ = ds_engine.initialize(model=net(), config=cfg(wall_clock_breakdown=True))
    with caplog.at_level(logging.INFO, logger="ds_engine"):
        train(engine, 8)
    lines = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("step=2, skipped=0, lr=") and "mom=" in m for m in lines), lines
    timing = [m for m in lines if m.startswith("time (ms) |")]
    assert timing and all(k in timing[0] for k in ("fwd:", "bwd:", "step:"))


def test_dump_state_prints_engine_and_config(capsys):
    ds_engine.initialize(model=net(), config=cfg(dump_state=True))
    out = capsys.readouterr().out
    assert "DeepSpeedEngine:" in out and "global_steps ....." in out
    assert "DeepSpeedEngine configuration:" in out and '"gradient_accumulation_steps": 4' in out


def test_gradient_clipping_reports_global_norm():
    engine, *_ = ds_engine.initialize(
        model=net(), config=cfg(gradient_clipping=1e-3, zero_optimization={"stage": 1})
    )
    train(engine, 4)
    norm = engine.get_global_grad_norm()
    assert norm is not None and norm > 1e-3


def test_fp32_stage0_reports_no_norm_as_deepspeed():
    """DeepSpeed's fp32 stage-0 optimizer is the bare torch one, which keeps no norm: the Trainer logs none."""
    engine, *_ = ds_engine.initialize(model=net(), config=cfg(gradient_clipping=1e-3))
    train(engine, 4)
    assert engine.get_global_grad_norm() is None


def test_checkpoint_roundtrip_continues_identically(tmp_path):
    def fresh():
        return ds_engine.initialize(model=net(), config=cfg(zero_optimization={"stage": 1}))[0]

    a = fresh()
    train(a, 8)
    a.save_checkpoint(tmp_path, client_state={"note": "hi"})
    lr_at_save = a.get_lr()
    train(a, 8)
    b = fresh()
    path, client = b.load_checkpoint(tmp_path)
    assert client == {"note": "hi"} and path.endswith("global_step2")
    assert b.global_steps == 2 and b.global_samples == 16
    assert b.get_lr() == pytest.approx(lr_at_save)
    train(b, 8)
    for pa, pb in zip(a.module.parameters(), b.module.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    assert b.global_steps == a.global_steps == 4


def test_load_without_latest_returns_none(tmp_path):
    engine, *_ = ds_engine.initialize(model=net(), config=cfg())
    with pytest.warns(UserWarning):
        assert engine.load_checkpoint(tmp_path) == (None, None)


def test_activation_checkpointing_is_configured_from_config():
    ds_engine.initialize(
        model=net(),
        config=cfg(activation_checkpointing={"cpu_checkpointing": True, "partition_activations": False}),
    )
    assert activation.is_configured()
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    activation.checkpoint(layer, x).sum().backward()
    assert x.grad is not None


def test_sparse_attention_from_config():
    config = ds_engine.initialize(
        model=net(),
        config=cfg(sparse_attention={"mode": "fixed", "block": 16, "attention": "unidirectional"}),
    )[0].ds_config
    attn = ds_engine.sparse_attention.sparse_self_attention(config, num_heads=2)
    q = torch.randn(1, 2, 64, 8)
    assert attn(q, q, q).shape == (1, 2, 64, 8)


@pytest.mark.parametrize("opt_level", ["O1", "O2"])
def test_amp_trains_through_the_engine(opt_level):
    engine, *_ = ds_engine.initialize(
        model=net(),
        config=cfg(
            gradient_accumulation_steps=1,
            train_batch_size=2,
            amp={"enabled": True, "opt_level": opt_level, "cast_model_type": "bfloat16"},
        ),
    )
    torch.manual_seed(3)
    x = torch.randn(2, 4)
    first = last = None
    for _ in range(6):
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        first = loss.item() if first is None else first
        last = loss.item()
    assert engine.global_steps == 6 and last < first

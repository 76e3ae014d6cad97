"""Engine-level config keys, each tested so that the test fails when the key is ignored."""

from __future__ import annotations

import ds_checkpoint
import ds_engine
import ds_optim
import ds_precision
import ds_zero
import pytest
import torch
import torch.distributed as dist


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(engine, steps: int) -> None:
    torch.manual_seed(1)
    for _ in range(steps):
        loss = engine(torch.randn(2, 4, dtype=engine.parts.dtype)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()


def _master(engine) -> torch.Tensor:
    tensors, _ = engine.optimizer.sharded_state_dict()
    return tensors["g0.master"].clone()


@pytest.mark.parametrize("from_fp32", [True, False])
def test_load_from_fp32_weights(tmp_path, from_fp32):
    """bf16 at ZeRO 1: true restores the saved fp32 master; false rebuilds it from the bf16 weights."""

    def config(load_from_fp32_weights: bool) -> dict:
        return {
            "train_batch_size": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "bf16": {"enabled": True},
            "zero_optimization": {"stage": 1, "load_from_fp32_weights": load_from_fp32_weights},
        }

    saver, *_ = ds_engine.initialize(model=_net(), config=config(True))
    _train(saver, 3)
    saver.save_checkpoint(tmp_path, tag="t")
    saved_master = _master(saver)
    from_weights = torch.cat([p.detach().float().reshape(-1) for p in saver.module.parameters()])
    assert not torch.equal(saved_master, from_weights), "the fp32 master must carry bits bf16 drops"

    loader, *_ = ds_engine.initialize(model=_net(), config=config(from_fp32))
    loader.load_checkpoint(tmp_path, tag="t")
    expected = saved_master if from_fp32 else from_weights
    torch.testing.assert_close(_master(loader), expected, rtol=0, atol=0)
    # the optimizer state itself is loaded either way
    loaded, _ = loader.optimizer.sharded_state_dict()
    torch.testing.assert_close(loaded["g0.exp_avg"], saver.optimizer.sharded_state_dict()[0]["g0.exp_avg"])


def test_gradient_clipping_bounds_the_applied_update():
    """With SGD(lr=1) the update is the clipped gradient: its norm is gradient_clipping."""
    clip = 1e-3
    engine, *_ = ds_engine.initialize(
        model=_net(),
        config={
            "train_batch_size": 2,
            "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
            "gradient_clipping": clip,
            "zero_optimization": {"stage": 1},  # stage 0 fp32 reports no norm, as DeepSpeed
            "zero_allow_untested_optimizer": True,
        },
    )
    before = [p.detach().clone() for p in engine.module.parameters()]
    _train(engine, 1)
    update = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(engine.module.parameters(), before)])
    assert engine.get_global_grad_norm() > 10 * clip
    assert update.norm().item() == pytest.approx(clip, rel=1e-3)


@pytest.mark.parametrize("mode, digest_reductions", [("Ignore", 0), ("Fail", 2)])
def test_tag_validation_mode_reaches_the_save(tmp_path, monkeypatch, mode, digest_reductions):
    """Ignore skips the tag check's two all-reduces (MIN and MAX of the tag's SHA-1); Warn/Fail run them."""
    engine, *_ = ds_engine.initialize(
        model=_net(),
        config={
            "train_batch_size": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
            "checkpoint": {"tag_validation": mode.lower()},
        },
    )
    assert dist.is_initialized()
    seen = []
    real = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        seen.append((tensor.dtype, tensor.numel()))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(ds_checkpoint._save.dist, "all_reduce", counting)
    engine.save_checkpoint(tmp_path, tag="t")
    assert seen.count((torch.int64, 20)) == digest_reductions


def _config(**extra) -> dict:
    return {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, **extra}


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_stage_chooses_the_wrapper(stage):
    engine, *_ = ds_engine.initialize(model=_net(), config=_config(zero_optimization={"stage": stage}))
    expected = ds_precision.MixedPrecisionOptimizer if stage == 0 else ds_zero.ZeroOptimizer
    assert type(engine.optimizer) is expected
    if stage:
        assert engine.optimizer.stage == stage


@pytest.mark.parametrize("device, optimizer_class", [("none", ds_optim.FusedAdam), ("cpu", ds_optim.DeepSpeedCPUAdam)])
def test_offload_optimizer_device_steps_with_cpu_adam(device, optimizer_class):
    zero = {"stage": 2, "offload_optimizer": {"device": device}}
    engine, *_ = ds_engine.initialize(model=_net(), config=_config(zero_optimization=zero))
    assert type(engine.basic_optimizer) is optimizer_class
    _train(engine, 1)
    assert engine.basic_optimizer.state  # the step ran on this optimizer


def test_zero_allow_untested_optimizer():
    untested = {"type": "RMSprop", "params": {"lr": 1e-3}}
    with pytest.raises(Exception, match="zero_allow_untested_optimizer"):
        ds_engine.initialize(model=_net(), config=_config(optimizer=untested, zero_optimization={"stage": 1}))
    engine, *_ = ds_engine.initialize(
        model=_net(),
        config=_config(
            optimizer=untested, zero_optimization={"stage": 1}, zero_allow_untested_optimizer=True
        ),
    )
    assert type(engine.basic_optimizer) is torch.optim.RMSprop


@pytest.mark.parametrize("accum_dtype, model_grad_kept", [("bf16", True), ("fp32", False)])
def test_bf16_grad_accum_dtype_moves_gradients_into_fp32_buffers(accum_dtype, model_grad_kept):
    """fp32 accumulation moves each micro-step's bf16 gradient into an fp32 buffer and frees .grad."""
    config = _config(
        train_batch_size=4,
        gradient_accumulation_steps=2,
        bf16={"enabled": True, "grad_accum_dtype": accum_dtype},
    )
    engine, *_ = ds_engine.initialize(model=_net(), config=config)
    loss = engine(torch.randn(2, 4, dtype=torch.bfloat16)).float().sum()
    engine.backward(loss)  # first micro-step: not a boundary
    assert all((p.grad is not None) == model_grad_kept for p in engine.module.parameters())


def test_amp_enabled_autocasts_the_forward():
    amp = {"enabled": True, "opt_level": "O1", "cast_model_type": "bfloat16"}
    engine, *_ = ds_engine.initialize(model=_net(), config=_config(amp=amp))
    assert engine(torch.randn(2, 4)).dtype == torch.bfloat16
    assert next(engine.module.parameters()).dtype == torch.float32  # O1 keeps fp32 weights


@pytest.mark.parametrize(
    "precision, dtype, scaled",
    [
        ({}, torch.float32, False),
        ({"fp16": {"enabled": True}}, torch.float16, True),
        ({"bf16": {"enabled": True}}, torch.bfloat16, False),
    ],
)
def test_precision_dtype_and_loss_scaler_follow_fp16_and_bf16_enabled(precision, dtype, scaled):
    engine, *_ = ds_engine.initialize(model=_net(), config=_config(**precision))
    assert all(p.dtype == dtype for p in engine.module.parameters())
    assert (engine.parts.scaler is not None) == scaled

"""Engine-level config keys, each tested so that the test fails when the key is ignored."""

from __future__ import annotations

import ds_checkpoint
import ds_engine
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
        config={"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 1.0}}, "gradient_clipping": clip},
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

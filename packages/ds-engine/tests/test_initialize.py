"""initialize(): DeepSpeed's argument rules, config errors, and what it returns (one process)."""

from __future__ import annotations

import argparse
import json
import logging

import ds_engine
import pytest
import torch
from ds_config import ConfigError

CFG = {"train_batch_size": 4, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}}


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_returns_engine_optimizer_loader_scheduler():
    data = torch.utils.data.TensorDataset(torch.randn(12, 4), torch.randn(12, 2))
    cfg = {**CFG, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}
    engine, optimizer, loader, scheduler = ds_engine.initialize(model=net(), config=cfg, training_data=data)
    assert isinstance(engine, ds_engine.DeepSpeedEngine)
    # fp32 at stage 0: the bare torch optimizer, as DeepSpeed returns it (its groups are the ones that step)
    assert optimizer is engine.basic_optimizer and scheduler is engine.lr_scheduler
    x, y = next(iter(loader))
    assert x.shape == (4, 4) and y.shape == (4, 2)
    assert engine.train_batch_size() == 4 and engine.gradient_accumulation_steps() == 1


def test_model_is_required():
    with pytest.raises(ds_engine.InitializeError, match="requires a model"):
        ds_engine.initialize(config=CFG)


def test_config_given_twice_is_an_error(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CFG))
    args = argparse.Namespace(deepspeed_config=str(path))
    with pytest.raises(ds_engine.InitializeError, match="both in the arguments"):
        ds_engine.initialize(args=args, model=net(), config=CFG)


def test_no_config_is_an_error():
    with pytest.raises(ds_engine.InitializeError, match="--deepspeed_config"):
        ds_engine.initialize(model=net())


def test_config_from_args_and_deprecated_deepscale(tmp_path, caplog):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(CFG))
    parser = ds_engine.add_config_arguments(argparse.ArgumentParser())
    engine, *_ = ds_engine.initialize(args=parser.parse_args(["--deepspeed_config", str(path)]), model=net())
    assert engine.train_batch_size() == 4
    with caplog.at_level(logging.WARNING, logger="ds_engine"):
        ds_engine.initialize(args=parser.parse_args(["--deepscale_config", str(path)]), model=net())
    assert "deprecated" in caplog.text


def test_config_params_is_used_when_config_is_none():
    engine, *_ = ds_engine.initialize(model=net(), config_params={**CFG, "train_batch_size": 8})
    assert engine.train_batch_size() == 8


def test_local_rank_mismatch():
    args = argparse.Namespace(local_rank=3)
    with pytest.raises(ds_engine.InitializeError, match="Mismatch in local rank"):
        ds_engine.initialize(args=args, model=net(), config=CFG)


def test_batch_error_names_numbers_and_world_size_source():
    with pytest.raises(ConfigError) as err:
        ds_engine.initialize(
            model=net(), config={**CFG, "train_batch_size": 10, "train_micro_batch_size_per_gpu": 3}
        )
    text = str(err.value)
    # the source is "default 1" in a fresh process, "torch.distributed" once another test made the group
    assert "10" in text and "3" in text and "world size 1 from" in text


def test_unknown_key_is_rejected_with_suggestion():
    with pytest.raises(ConfigError, match="gradient_clipping"):
        ds_engine.initialize(model=net(), config={**CFG, "gradient_clippin": 1.0})


def test_no_optimizer_anywhere_is_an_engine_for_evaluation():
    """As DeepSpeed 0.19.8 (test_deepspeed_behaviour.py compares with its record): training is refused."""
    engine, optimizer, _, _ = ds_engine.initialize(model=net(), config={"train_batch_size": 4})
    assert optimizer is None
    with pytest.raises(AssertionError, match="must provide optimizer during init in order to use backward"):
        engine.backward(engine(torch.ones(4, 4)).sum())


def test_client_optimizer_and_scheduler_factory():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, _, _, sched = ds_engine.initialize(
        model=model,
        optimizer=opt,
        config={"train_batch_size": 4},
        lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    )
    assert isinstance(sched, torch.optim.lr_scheduler.StepLR)
    loss = engine(torch.randn(4, 4)).sum()
    engine.backward(loss)
    engine.step()
    assert engine.get_lr() == [0.25]


def test_config_scheduler_wins_over_client_scheduler(caplog):
    model = net()
    cfg = {**CFG, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}
    with caplog.at_level(logging.WARNING, logger="ds_engine"):
        _, _, _, sched = ds_engine.initialize(model=model, config=cfg, lr_scheduler=object())
    assert type(sched).__name__ == "WarmupLR"
    assert "using the config's" in caplog.text


def test_deepspeed_init_distributed_signature():
    topology = ds_engine.init_distributed(dist_backend="gloo", verbose=False)
    assert topology.world_size == 1 and topology.rank == 0


def test_strict_config_error_says_how_to_load_leniently():
    cfg = {**CFG, "zero_quantized_weights": False}
    with pytest.raises(ConfigError, match="config_strict=False.*DS_CONFIG_STRICT=0"):
        ds_engine.initialize(model=net(), config=cfg)


def test_lenient_loading_by_argument_and_by_environment(monkeypatch):
    cfg = {**CFG, "zero_quantized_weights": False}
    with pytest.warns(UserWarning, match="zero_quantized_weights"):
        ds_engine.initialize(model=net(), config=dict(cfg), config_strict=False)
    monkeypatch.setenv("DS_CONFIG_STRICT", "0")
    with pytest.warns(UserWarning, match="zero_quantized_weights"):
        ds_engine.initialize(model=net(), config=dict(cfg))
    with pytest.raises(ConfigError, match="FLOPs profiler"):  # an enabled missing feature is never ignored
        ds_engine.initialize(model=net(), config={**cfg, "flops_profiler": {"enabled": True}})


def test_dataloader_drop_last_reaches_the_loader():
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.randn(10, 2))
    for drop, batches in ((False, 3), (True, 2)):
        _, _, loader, _ = ds_engine.initialize(
            model=net(), config={**CFG, "dataloader_drop_last": drop}, training_data=data
        )
        assert len(loader) == batches

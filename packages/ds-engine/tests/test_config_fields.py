"""ds_engine.CONFIG_FIELDS is exactly what the engine's own code reads from the typed config."""

from __future__ import annotations

import ds_config
import ds_engine
import pytest
import torch
from ds_config.testing import ConfigReads
from ds_engine import _initialize


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))


@pytest.fixture
def reads(monkeypatch) -> ConfigReads:
    """Every config initialize() loads is a recording copy."""
    recorder = ConfigReads()
    real = ds_config.load_config
    monkeypatch.setattr(_initialize, "load_config", lambda *a, **kw: recorder.wrap(real(*a, **kw)))
    return recorder


def test_config_fields_match_what_the_engine_reads(reads, tmp_path):
    base = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    zero_offload = {"stage": 1, "offload_optimizer": {"device": "cpu"}}
    monitor = {"enabled": True, "output_path": str(tmp_path / "logs"), "job_name": "j"}
    configs = [
        {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}},
        {"fp16": {"enabled": True}},
        {"zero_optimization": zero_offload},
        # stage 0 reads the clipping and accumulation keys for its precision wrapper; stage 3 reads its
        # own through ZeroStage3Optimizer.from_config (ds_zero.CONFIG_FIELDS_STAGE3)
        {"bf16": {"enabled": True, "grad_accum_dtype": "fp32"}},
        {"bf16": {"enabled": True, "grad_accum_dtype": "fp32"}, "zero_optimization": {"stage": 3}},
        {"csv_monitor": monitor},
    ]
    declared = set(ds_engine.CONFIG_FIELDS)
    try:
        import tensorboard  # noqa: F401

        configs.append({"tensorboard": monitor})
    except ImportError:  # the tensorboard writer needs the package: its keys cannot be read here
        declared -= {"tensorboard.output_path", "tensorboard.job_name"}
    for extra in configs:
        engine, *_ = ds_engine.initialize(
            model=_net(), config={**base, **extra}, training_data=[torch.zeros(4)] * 4
        )
        loss = engine(torch.ones(2, 4, dtype=engine.parts.dtype)).float().sum()
        engine.backward(loss)
        engine.step()
        engine.save_checkpoint(tmp_path, tag="t")
        engine.load_checkpoint(tmp_path, tag="t")
    _pipeline_reads(tmp_path)
    reads.check("ds_engine", declared)


def _pipeline_reads(tmp_path) -> None:
    """A one-stage PipelineModule: the pipeline engine reads its section."""
    import ds_pipe

    torch.manual_seed(0)
    model = ds_pipe.PipelineModule(
        [torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)],
        num_stages=1,
        loss_fn=lambda out, y: (out - y).pow(2).mean(),
    )
    config = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, *_ = ds_engine.initialize(
        model=model, config={**config, "pipeline": {"activation_checkpoint_interval": 1}}
    )
    engine.train_batch(iter([(torch.ones(2, 4), torch.zeros(2, 1))]))

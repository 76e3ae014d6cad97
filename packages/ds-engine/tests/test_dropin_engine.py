"""The engine methods DeepSpeed scripts call, the client-optimizer rule, save_16bit_model, the monitors."""

from __future__ import annotations

import csv
import json
import logging
import sys
from pathlib import Path

import ds_engine
import pytest
import torch

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_behaviour.json").read_text())

CFG = {"train_batch_size": 4, "steps_per_print": 100, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}}


def net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def train(engine, steps: int) -> list[float]:
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 4, dtype=engine.parts.dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def test_getters_answer_from_the_config_and_topology():
    cfg = {**CFG, "bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "gradient_clipping": 0.5}
    engine, *_ = ds_engine.initialize(model=net(), config=cfg)
    assert engine.bfloat16_enabled() and not engine.fp16_enabled() and not engine.amp_enabled()
    assert engine.zero_optimization() and engine.zero_optimization_stage() == 1
    assert not engine.zero_optimization_partition_gradients() and not engine.zero_cpu_offload()
    assert engine.gradient_clipping() == 0.5 and engine.steps_per_print() == 100
    assert engine.train_batch_size() == 4 and engine.train_micro_batch_size_per_gpu() == 4
    assert engine.global_rank == 0 and engine.local_rank == 0 and engine.world_size == 1
    assert engine.device == torch.device("cpu") and engine.optimizer_name() == "adam"
    assert engine.get_mom() == [(0.9, 0.999)] and engine.get_lr() == [1e-2]
    assert engine.global_steps == engine.global_samples == engine.skipped_steps == 0
    train(engine, 2)
    assert engine.global_steps == 2 and engine.global_samples == 8 and engine.was_step_applied()
    assert engine.get_global_grad_norm() is not None


def test_set_train_batch_size_changes_accumulation():
    engine, *_ = ds_engine.initialize(model=net(), config=CFG)
    assert engine.config["gradient_accumulation_steps"] != 3  # read once: engine.config must not go stale
    engine.set_train_batch_size(12)
    assert engine.gradient_accumulation_steps() == 3 and engine.train_batch_size() == 12
    assert engine.config["gradient_accumulation_steps"] == 3 and engine.config["train_batch_size"] == 12
    engine.set_train_micro_batch_size(2)  # accumulation stays, the train batch follows
    assert engine.config["train_micro_batch_size_per_gpu"] == 2 and engine.config["train_batch_size"] == 6
    engine.set_train_micro_batch_size(4)
    assert [engine.is_gradient_accumulation_boundary() for _ in range(1)] == [False]
    with pytest.raises(ValueError, match="divisible"):
        engine.set_train_batch_size(6)


def test_train_eval_and_attributes_reach_the_module():
    model = net()
    model.vocab_size = 11  # e.g. a Hugging Face model's config attribute
    engine, *_ = ds_engine.initialize(model=model, config=CFG)
    engine.eval()
    assert not model.training
    engine.train()
    assert model.training and engine.vocab_size == 11 and engine.module is model
    with pytest.raises(AttributeError):
        engine.no_such_attribute  # noqa: B018


def test_client_optimizer_wins_over_the_config_one_and_is_returned_at_fp32_stage0(caplog):
    model = net()
    client = torch.optim.SGD(model.parameters(), lr=0.5)
    with caplog.at_level(logging.WARNING, logger="ds_engine"):
        engine, optimizer, *_ = ds_engine.initialize(model=model, optimizer=client, config=CFG)
    assert "using the client's" in caplog.text
    assert optimizer is client and engine.basic_optimizer is client and engine.optimizer_name() == "SGD"
    before = [p.detach().clone() for p in model.parameters()]
    engine.backward(engine(torch.ones(4, 4)).pow(2).mean())  # one rank, no accumulation: autograd's gradients
    grads = [p.grad.clone() for p in model.parameters()]
    engine.step()
    for b, g, p in zip(before, grads, model.parameters(), strict=True):
        assert torch.allclose(p.detach(), b - 0.5 * g, atol=1e-6)  # SGD at lr 0.5, not the config's Adam


def test_with_bf16_initialize_returns_the_engines_wrapper():
    model = net()
    client = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, optimizer, *_ = ds_engine.initialize(
        model=model, optimizer=client, config={"train_batch_size": 4, "bf16": {"enabled": True}}
    )
    assert optimizer is engine.optimizer and optimizer is not client


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_no_sync_is_refused_where_deepspeed_refuses_it(stage):
    """DeepSpeed 0.19.8 refuses no_sync only where ZeRO partitions gradients (2, 3), with an AssertionError."""
    recorded = RECORD["no_sync"]["refusals"][f"stage{stage}"]
    engine, *_ = ds_engine.initialize(model=net(), config={**CFG, "zero_optimization": {"stage": stage}})
    if recorded is None:
        with engine.no_sync():
            pass
        return
    assert recorded["mro"][0] == "AssertionError"
    with pytest.raises(AssertionError) as raised, engine.no_sync():
        pass
    assert str(raised.value) == recorded["message"]


def test_no_sync_refuses_a_step_inside_and_nesting():
    engine, *_ = ds_engine.initialize(model=net(), config=CFG)
    with pytest.raises(AssertionError, match="illegal to call Engine.step"), engine.no_sync():
        engine.step()
    with pytest.raises(AssertionError, match="reentry"), engine.no_sync(), engine.no_sync():
        pass


@pytest.mark.parametrize("filename", ["pytorch_model.bin", "model.safetensors"])
def test_save_16bit_model_writes_the_weights_in_their_dtype(tmp_path, filename):
    engine, *_ = ds_engine.initialize(model=net(), config={**CFG, "bf16": {"enabled": True}})
    train(engine, 1)
    assert engine.save_16bit_model(tmp_path, filename)
    if filename.endswith(".safetensors"):
        import safetensors.torch

        saved = safetensors.torch.load_file(tmp_path / filename)
    else:
        saved = torch.load(tmp_path / filename, weights_only=True)
    for name, tensor in engine.module.state_dict().items():
        assert saved[name].dtype == torch.bfloat16 and torch.equal(saved[name], tensor)
    assert [p.name for p in tmp_path.iterdir()] == [filename]  # nothing temporary left behind


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_monitor_writes_deepspeeds_events(tmp_path):
    monitor = {"enabled": True, "output_path": str(tmp_path), "job_name": "job"}
    cfg = {**CFG, "fp16": {"enabled": True, "initial_scale_power": 8}, "csv_monitor": monitor}
    engine, *_ = ds_engine.initialize(model=net(), config=cfg)
    losses = train(engine, 3)
    job = tmp_path / "job"
    lr = _read_csv(job / "Train_Samples_lr.csv")
    assert lr[0] == ["step", "lr"] and [int(r[0]) for r in lr[1:]] == [4, 8, 12]
    assert all(float(r[1]) == 1e-2 for r in lr[1:])
    loss = _read_csv(job / "Train_Samples_train_loss.csv")
    assert loss[0] == ["step", "train_loss"] and [int(r[0]) for r in loss[1:]] == [0, 4, 8]
    assert [float(r[1]) for r in loss[1:]] == pytest.approx(losses, rel=1e-6)
    scale = _read_csv(job / "Train_Samples_loss_scale.csv")
    assert scale[0] == ["step", "loss_scale"] and float(scale[1][1]) == 256.0


def test_tensorboard_writes_the_same_events(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monitor = {"enabled": True, "output_path": str(tmp_path), "job_name": "tb"}
    engine, *_ = ds_engine.initialize(model=net(), config={**CFG, "tensorboard": monitor})
    losses = train(engine, 2)
    engine.destroy()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["Train/Samples/lr", "Train/Samples/train_loss"]
    assert [e.step for e in events.Scalars("Train/Samples/lr")] == [4, 8]
    assert [e.value for e in events.Scalars("Train/Samples/train_loss")] == pytest.approx(losses, rel=1e-6)


def test_tensorboard_missing_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard -> ImportError
    monitor = {"enabled": True, "output_path": str(tmp_path)}
    with pytest.raises(ImportError, match="pip install tensorboard"):
        ds_engine.initialize(model=net(), config={**CFG, "tensorboard": monitor})

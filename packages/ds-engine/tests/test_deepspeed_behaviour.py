"""ds against DeepSpeed 0.19.8, name for name: what ``backward`` returns, what refusals raise.

DeepSpeed's side is recorded in ``fixtures/deepspeed_behaviour.json`` by
``DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_deepspeed_behaviour_fixtures.py`` (deepspeed 0.19.8).
DeepSpeed cannot run fp16 on the CPU; its ``backward`` returns the accumulation-scaled loss before the
loss scaler multiplies it (engine.py, ``gas_scaled_loss``), so fp16 is checked against the fp32 record.
"""

from __future__ import annotations

import json
from pathlib import Path

import ds_engine
import pytest
import torch

RECORD = json.loads((Path(__file__).parent / "fixtures/deepspeed_behaviour.json").read_text())


def _net(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dtype)


def _engine(dtype=torch.float32, optimizer=None, **config):
    model = _net(dtype)
    opt = optimizer(model.parameters()) if optimizer else torch.optim.SGD(model.parameters(), lr=0.1)
    full = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2, **config}
    return ds_engine.initialize(model=model, optimizer=opt, config=full)[0]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("scale_wrt_gas", [True, False])
def test_backward_returns_the_loss_scaled_for_accumulation(precision, scale_wrt_gas):
    dtype, extra = (torch.float16, {"fp16": {"enabled": True}}) if precision == "fp16" else (torch.float32, {})
    engine = _engine(dtype, **extra)
    loss = engine(torch.randn(1, 4, dtype=dtype)).float().sum() * 0 + RECORD["loss"]
    got = engine.backward(loss, scale_wrt_gas=scale_wrt_gas)
    expected = RECORD["backward"][f"fp32.scale_wrt_gas={scale_wrt_gas}"]
    assert float(got) == expected["value"] and str(got.dtype) == expected["dtype"]
    if precision == "fp16":
        assert engine.loss_scale > 1  # the loss scale is applied to the gradients, not to what is returned


@pytest.mark.parametrize("save_dir", [None, ""], ids=["none", "empty"])
def test_save_checkpoint_refuses_no_directory(save_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    engine = _engine(gradient_accumulation_steps=1)
    recorded = RECORD["save_checkpoint_none" if save_dir is None else "save_checkpoint_empty"]
    with pytest.raises(ValueError) as raised:
        engine.save_checkpoint(save_dir)
    assert str(raised.value) == recorded["message"] and recorded["mro"][0] == "ValueError"
    assert list(tmp_path.iterdir()) == []  # nothing written into the working directory


def test_initialize_without_model_is_an_assertion_error():
    assert RECORD["initialize_model_none"]["mro"][0] == "AssertionError"
    with pytest.raises(AssertionError, match="requires a model") as raised:
        ds_engine.initialize(model=None, config={"train_micro_batch_size_per_gpu": 1})
    assert isinstance(raised.value, ds_engine.InitializeError)


def test_untested_client_optimizer_is_an_assertion_error():
    recorded = RECORD["untested_client_optimizer"]
    assert recorded["mro"][0] == "AssertionError" and "zero_allow_untested_optimizer" in recorded["message"]
    with pytest.raises(AssertionError, match="zero_allow_untested_optimizer") as raised:
        _engine(optimizer=torch.optim.RMSprop, gradient_accumulation_steps=1, zero_optimization={"stage": 1})
    import ds_zero

    assert isinstance(raised.value, ds_zero.ZeroConfigError)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"LOCAL_SIZE": "3"}, RECORD["device_count"]["LOCAL_SIZE=3"]),
        ({}, RECORD["device_count"]["LOCAL_SIZE=None"]),
        ({"RANK": "0", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, 4),  # torchrun / ds-launch
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
    ],
)
def test_cpu_device_count_is_the_local_world_size(monkeypatch, env, expected):
    from ds_engine.accelerator import get_accelerator

    for name in ("LOCAL_SIZE", "LOCAL_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert get_accelerator().device_count() == expected

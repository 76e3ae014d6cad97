"""ds against DeepSpeed 0.19.8, name for name: what ``backward`` returns, what refusals raise.

DeepSpeed's side is recorded in ``fixtures/deepspeed_behaviour.json`` by
``DS_ACCELERATOR=cpu $DS_DEEPSPEED_PYTHON tools/fixtures/make_deepspeed_behaviour_fixtures.py`` (deepspeed 0.19.8).
DeepSpeed cannot run fp16 on the CPU; its ``backward`` returns the accumulation-scaled loss before the
loss scaler multiplies it (engine.py, ``gas_scaled_loss``), so fp16 is checked against the fp32 record.
"""

from __future__ import annotations

import json
from pathlib import Path

import ds_engine
import ds_optim
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
    dtype, extra = (
        (torch.float16, {"fp16": {"enabled": True}}) if precision == "fp16" else (torch.float32, {})
    )
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


# ---- LR schedules (deepspeed.runtime.lr_schedules is ds_optim's): a tensor lr, per-group lists, methods
def _sgd(lr, groups=1):
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(groups)]
    return torch.optim.SGD([{"params": [p]} for p in params], lr=lr)


_SCHEDULES = {
    "WarmupLR": lambda o, per: ds_optim.WarmupLR(
        o, warmup_min_lr=per([0.0, 0.001]), warmup_max_lr=per([0.01, 0.02]), warmup_num_steps=4
    ),
    "WarmupDecayLR": lambda o, per: ds_optim.WarmupDecayLR(
        o,
        total_num_steps=8,
        warmup_min_lr=per([0.0, 0.001]),
        warmup_max_lr=per([0.01, 0.02]),
        warmup_num_steps=4,
    ),
    "WarmupCosineLR": lambda o, per: ds_optim.WarmupCosineLR(o, total_num_steps=8, warmup_num_steps=4),
    "OneCycle": lambda o, per: ds_optim.OneCycle(
        o, cycle_min_lr=per([0.001, 0.002]), cycle_max_lr=per([0.01, 0.02]), cycle_first_step_size=3
    ),
    "LRRangeTest": lambda o, per: ds_optim.LRRangeTest(o, lr_range_test_min_lr=per([0.001, 0.002])),
}


def _trace(schedule, optimizer) -> list[dict]:
    rows = []
    for _ in range(5):
        schedule.step()
        last = schedule.get_last_lr()
        row = {
            "group_lr_is_tensor": torch.is_tensor(optimizer.param_groups[0]["lr"]),
            "group_lrs": [float(g["lr"]) for g in optimizer.param_groups],
            "last_lr_types": [type(v).__name__ for v in last],
            "last_lr": [float(v) for v in last],
        }
        if hasattr(schedule, "get_lr_ratio"):
            row["lr_ratio"] = float(schedule.get_lr_ratio())
        rows.append(row)
    return rows


def _same_rows(ours: list[dict], theirs: list[dict]) -> None:
    for a, b in zip(ours, theirs, strict=True):
        for key, value in a.items():
            if isinstance(value, list) and value and isinstance(value[0], float):
                assert value == pytest.approx(b[key], rel=1e-6, abs=1e-9), (key, a, b)
            else:
                assert value == b[key], (key, a, b)


@pytest.mark.parametrize("name", list(_SCHEDULES))
def test_lr_schedule_keeps_a_tensor_lr_a_tensor(name):
    recorded = RECORD["lr_schedules"][name]["tensor_lr"]
    optimizer = _sgd(torch.tensor(0.01))
    schedule = _SCHEDULES[name](optimizer, lambda v: v[0])
    assert torch.is_tensor(optimizer.param_groups[0]["lr"]) == recorded["at_init_is_tensor"]
    _same_rows(_trace(schedule, optimizer), recorded["steps"])


@pytest.mark.parametrize("name", list(_SCHEDULES))
def test_lr_schedule_per_group_values(name):
    optimizer = _sgd(0.05, groups=2)
    _same_rows(
        _trace(_SCHEDULES[name](optimizer, lambda v: v), optimizer), RECORD["lr_schedules"][name]["per_group"]
    )
    recorded = RECORD["lr_schedules"][name]["wrong_list_length"]
    if recorded is not None:
        with pytest.raises(ValueError, match="expected 2"):
            _SCHEDULES[name](_sgd(0.05, groups=2), lambda v: [v[0]] * 3)


@pytest.mark.parametrize("name", list(_SCHEDULES))
def test_lr_schedule_has_deepspeeds_methods(name):
    ours = getattr(ds_optim, name)
    missing = [m for m in RECORD["lr_schedules"][name]["methods"] if not callable(getattr(ours, m, None))]
    assert missing == []


# ---- initialize without an optimizer: an engine for evaluation
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_initialize_without_an_optimizer_gives_an_engine_for_evaluation(stage):
    recorded = RECORD["no_optimizer"][f"stage{stage}"]
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": stage}}
    if "initialize" in recorded:  # DeepSpeed refuses ZeRO 1 and 2 without an optimizer
        assert recorded["initialize"]["mro"][0] == "AssertionError"
        with pytest.raises(AssertionError) as raised:
            ds_engine.initialize(model=_net(), config=config)
        assert str(raised.value) == recorded["initialize"]["message"]
        return
    engine, optimizer, _, scheduler = ds_engine.initialize(model=_net(), config=config)
    assert (optimizer is None) == (recorded["optimizer"] is None) and scheduler is None
    x = torch.linspace(-1, 1, 8).reshape(2, 4)
    assert engine(x).detach().flatten().tolist() == pytest.approx(recorded["forward"], abs=1e-6)
    engine.eval()
    with torch.no_grad():
        assert engine(x).flatten().tolist() == pytest.approx(recorded["eval_forward"], abs=1e-6)
    engine.train()
    # DeepSpeed refuses backward and step with an AssertionError at stage 0; its stage 3 fails inside with
    # AttributeErrors: ds gives stage 0's refusal at every stage
    message = RECORD["no_optimizer"]["stage0"]
    with pytest.raises(AssertionError) as raised:
        engine.backward(engine(x).sum())
    assert str(raised.value) == message["backward"]["message"]
    assert all(p.grad is None for p in engine.module.parameters())
    with pytest.raises(AssertionError) as raised:
        engine.step()
    assert str(raised.value) == message["step"]["message"]
    assert engine.global_steps == recorded["global_steps"]
    assert engine.get_lr() == message["get_lr"]["value"]


# ---- ZeRO-3: a module returns a parameter of another module (DeepSpeed's "dangling" external parameter)
class _Dangling(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x), self.bias  # its own parameter, returned to the parent


class _Middle(torch.nn.Linear):
    def __init__(self, seen: list):
        super().__init__(6, 6)
        self.inner = _Dangling(6, 6)
        self.seen = seen

    def forward(self, x):
        out, bias = self.inner(super().forward(x))
        self.seen.append(bias.ds_status if hasattr(bias, "ds_status") else None)
        return out, bias  # the inner module's parameter, passed on by this one


class _Container(torch.nn.Module):
    def __init__(self, seen: list):
        super().__init__()
        self.first = torch.nn.Linear(6, 6)
        self.middle = _Middle(seen)

    def forward(self, x):
        out, bias = self.middle(self.first(x))
        return (out + bias).pow(2).mean()  # the parameter is used outside the module that owns it


@pytest.mark.parametrize("stage", [0, 3])
def test_zero3_module_returning_another_modules_parameter(stage):
    recorded = RECORD["external_parameter"][f"stage{stage}"]
    assert recorded["error"] is None
    seen: list = []
    torch.manual_seed(0)
    model = _Container(seen)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "zero_allow_untested_optimizer": True,
    }
    engine = ds_engine.initialize(model=model, config=config)[0]
    losses = []
    for step in range(3):
        loss = engine(torch.linspace(-1, 1, 12).reshape(2, 6) * (step + 1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert losses == pytest.approx(recorded["losses"], rel=1e-6)
    if stage == 3:
        from ds_zero.stage3 import ZeroParamStatus

        # available while it is returned and used; released after the step, as in DeepSpeed
        assert {str(s) for s in seen} == set(recorded["returned_bias_status"])
        assert str(model.middle.inner.bias.ds_status) == recorded["inner_bias_status_after"]
        assert ZeroParamStatus.AVAILABLE.name == "AVAILABLE"

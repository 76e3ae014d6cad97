"""The rank side of test_engine_step_guard.py: scenarios run inside test_dropin_ranks.py's 2-rank launch
(``checks``), so the guard's tests add no launch of their own."""

from __future__ import annotations

import ds_engine
import torch
from ds_checkpoint import activation

STAGES = (0, 1, 2, 3)
# the stages each scenario runs at: every engine costs launch time, so each where it tells something
WHERE = {
    "direct": STAGES,
    "after_engine_backward": (0,),
    "before_engine_backward": (0, 3),
    "before_engine_backward_gas2": (2,),  # ZeRO 2's backward takes them out of .grad: still refused
    "engine_backward": (0, 3),
    "accumulation": (0, 2),
    "no_gradients": (0, 3),
    "others_cleared": (0, 3),
}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.unused = torch.nn.Linear(2, 2)  # never in forward: no gradient, ever

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _engine(stage: int, gas: int = 1):
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    return ds_engine.initialize(model=Net(), config=config)[0]


def _weights(engine, stage: int) -> list[list[float]]:
    params = list(engine.module.body.parameters())
    with ds_engine.zero.GatheredParameters(params, enabled=stage == 3):
        return [p.detach().flatten().tolist() for p in params]


def _loss(engine, rank: int, micro: int = 0) -> torch.Tensor:
    return engine(torch.full((2, 4), float(rank + 1 + micro))).pow(2).mean()  # each rank its own data


def _attempt(fn) -> dict:
    try:
        return {"weights": fn()}
    except Exception as exc:  # noqa: BLE001 - the test reads it
        return {"error": f"{type(exc).__name__}: {exc}"}


def _stage_scenarios(rank: int, stage: int) -> dict:
    def direct():
        e = _engine(stage)
        _loss(e, rank).backward()
        e.step()
        return _weights(e, stage)

    def after_engine_backward():  # the engine's backward, then one of the script's on top of it
        e = _engine(stage)
        e.backward(_loss(e, rank))
        _loss(e, rank, 1).backward()
        e.step()
        return _weights(e, stage)

    def engine_backward():
        e = _engine(stage)
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def accumulation():  # backward twice, the second step() is the boundary
        e = _engine(stage, gas=2)
        for micro in range(2):
            e.backward(_loss(e, rank, micro))
            e.step()
        return _weights(e, stage)

    def no_gradients():  # a step with no backward at all, then a normal one
        e = _engine(stage)
        e.step()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def others_cleared():  # another backward's gradients (a GAN's generator pass), cleared before ours
        e = _engine(stage)
        _loss(e, rank, 2).backward()
        e.zero_grad()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, stage)

    def before_engine_backward(gas: int):  # the script's backward, then the engine's on top of it
        e = _engine(stage, gas)
        for micro in range(gas):
            _loss(e, rank, 2).backward()
            e.backward(_loss(e, rank, micro))
            e.step()
        return _weights(e, stage)

    scenarios = {
        "direct": direct,
        "after_engine_backward": after_engine_backward,
        "before_engine_backward": lambda: before_engine_backward(1),
        "before_engine_backward_gas2": lambda: before_engine_backward(2),
        "engine_backward": engine_backward,
        "accumulation": accumulation,
        "no_gradients": no_gradients,
        "others_cleared": others_cleared,
    }
    return {name: _attempt(fn) for name, fn in scenarios.items() if stage in WHERE[name]}


def _below_stage_2(rank: int) -> dict:
    out = {}

    def no_sync():
        e = _engine(1, gas=2)
        with e.no_sync():
            e.backward(_loss(e, rank))
        e.step()
        e.backward(_loss(e, rank, 1))
        e.step()
        return _weights(e, 1)

    def module_zero_grad():  # cleared by the module itself (set_to_none), not the engine
        e = _engine(0)
        _loss(e, rank, 2).backward()
        e.module.zero_grad()
        e.backward(_loss(e, rank))
        e.step()
        return _weights(e, 0)

    def checkpointed():  # activation checkpointing re-runs forward and backward inside engine.backward
        e = _engine(0)
        x = torch.full((2, 4), float(rank + 1), requires_grad=True)
        e.backward(activation.checkpoint(e.module.body, x).pow(2).mean())
        e.step()
        return _weights(e, 0)

    for name, fn in (
        ("no_sync", no_sync),
        ("module_zero_grad", module_zero_grad),
        ("checkpointed", checkpointed),
    ):
        out[name] = _attempt(fn)
    return out


def checks(rank: int, world: int) -> dict:
    return {"stages": {s: _stage_scenarios(rank, s) for s in STAGES}, "misc": _below_stage_2(rank)}

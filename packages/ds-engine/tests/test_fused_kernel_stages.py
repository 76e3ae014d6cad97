"""A client AdamW left at torch's kernel default steps on the fused kernel at every ZeRO stage (2 gloo ranks).

Observed directly: the inner optimizer's group flag and the calls of ``torch._fused_adamw_``; an explicit
``foreach=True`` is kept (no fused call); the losses of both paths agree within the parity tolerance.
"""

from __future__ import annotations

import ds_engine
import pytest
import torch
from rank_testing import spawn


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


STAGES = [0, 1, 2, 3]


def _every_stage(rank: int, world: int) -> dict[int, list[dict]]:
    """Per stage, the default (kernel left to torch) and an explicit foreach=True, all in one pair of processes
    (spawning is the expensive part)."""
    return {
        stage: [_train(rank, world, stage, {}), _train(rank, world, stage, {"foreach": True})]
        for stage in STAGES
    }


def _train(rank: int, world: int, stage: int, kernel: dict) -> dict:
    calls = [0]
    real = torch._fused_adamw_

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    torch._fused_adamw_ = counted  # this spawned rank's own torch module
    try:
        return _run(rank, world, stage, kernel, calls)
    finally:
        torch._fused_adamw_ = real


def _run(rank: int, world: int, stage: int, kernel: dict, calls: list[int]) -> dict:
    model = _net()
    cfg = {
        "train_batch_size": 4 * world,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
    }
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **kernel)
    engine, *_ = ds_engine.initialize(model=model, optimizer=opt, config=cfg)
    torch.manual_seed(10 + rank)
    losses = []
    for _ in range(4):
        loss = engine(torch.randn(4, 16)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return {
        "fused_flag": engine.basic_optimizer.param_groups[0]["fused"],
        "calls": calls[0],
        "losses": losses,
    }


@pytest.fixture(scope="module")
def runs() -> list[dict[int, list[dict]]]:
    return spawn(_every_stage, 2)


@pytest.mark.parametrize("stage", STAGES)
def test_client_adamw_steps_on_the_fused_kernel(runs, stage):
    for default, explicit in (by_stage[stage] for by_stage in runs):
        assert default["fused_flag"] is True
        assert default["calls"] == 4, "one fused AdamW call per optimizer step"
        assert explicit["fused_flag"] is None and explicit["calls"] == 0, "foreach=True is kept"
        torch.testing.assert_close(default["losses"], explicit["losses"], rtol=0, atol=1e-4)

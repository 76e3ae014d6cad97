"""OneBitAdam through the engine on 2 real ranks: warm-up averages gradients, then 1-bit compression."""

from __future__ import annotations

import ds_engine
import torch
from rank_testing import spawn

FREEZE = 3


def _train(rank: int, world_size: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64))
    cfg = {
        "train_batch_size": 8 * world_size,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "OneBitAdam",
            "params": {"lr": 1e-3, "freeze_step": FREEZE, "comm_backend_name": "gloo"},
        },
    }
    engine, *_ = ds_engine.initialize(model=model, config=cfg)
    g = torch.Generator().manual_seed(rank)  # each rank its own data: gradients differ across ranks
    losses, reduced = [], []
    for _ in range(10):
        x = torch.randn(8, 64, generator=g)
        reduced.append(engine._reduce_this_step())
        loss = (engine(x) - x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().reshape(-1) for p in engine.module.parameters()])
    return {
        "losses": losses,
        "reduced": reduced,
        "weights": flat,
        "bytes": engine.basic_optimizer.last_step_bytes_sent,
        "fp32_bytes": engine.basic_optimizer.fp32_allreduce_bytes(),
    }


def test_onebit_adam_engine_two_ranks():
    r0, r1 = spawn(_train, 2)
    assert r0["reduced"] == [True] * FREEZE + [False] * (10 - FREEZE)
    torch.testing.assert_close(r0["weights"], r1["weights"], rtol=0, atol=0)  # replicas stay identical
    assert 0 < r0["bytes"] <= r0["fp32_bytes"] / 20
    assert r0["losses"][-1] < r0["losses"][0]

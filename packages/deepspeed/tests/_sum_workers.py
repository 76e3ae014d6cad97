"""Rank workers for test_gradient_sum.py: one SGD step at ZeRO 0-2 with averaged and with summed gradients."""

from __future__ import annotations

import torch


def step_deltas(rank: int, world_size: int) -> dict:
    import deepspeed

    out = {}
    for stage in (0, 1, 2):
        for op in ("mean", "sum"):
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2)
            before = model.weight.detach().clone()
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            config = {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_clipping": 0.0,
                "gradient_allreduce_op": op,
                "zero_optimization": {"stage": stage},
                "zero_allow_untested_optimizer": True,
            }
            engine = deepspeed.initialize(model=model, optimizer=opt, config=config)[0]
            x = torch.full((1, 4), float(rank + 1))
            engine.backward(engine(x).sum())
            engine.step()
            out[f"{stage}.{op}"] = (before - model.weight.detach()).clone()
    return out

"""A ds engine resumed from an imported DeepSpeed ZeRO-3 checkpoint continues as DeepSpeed itself continued.

The fixtures (packages/ds-checkpoint/tests/fixtures/zero3_*, from tools/fixtures/make_deepspeed_fixtures.py) hold
a checkpoint the real deepspeed 0.19.8 saved after 3 steps on 2 ranks, and the losses of the 3 steps it
took next. Here the checkpoint is imported and converted, a ds engine at 1 or 2 ranks and ZeRO stage 2
or 3 loads it and takes the same 3 steps on the same global batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ds_checkpoint import load_deepspeed
from rank_testing import spawn

FIXTURES = Path(__file__).resolve().parents[2] / "ds-checkpoint" / "tests" / "fixtures"
GLOBAL_BATCH = 8  # 2 DeepSpeed ranks x micro batch 4
RESUME_SEED = 7  # tools/fixtures/make_deepspeed_fixtures.py


def _model(dtype: str) -> torch.nn.Module:
    """The fixture's stage-3 model (tools/fixtures/make_deepspeed_fixtures.py); its weights come from the checkpoint."""
    norm = torch.nn.LayerNorm(3) if dtype == "bf16" else torch.nn.BatchNorm1d(3)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 3), norm, torch.nn.ReLU(), torch.nn.Linear(3, 3), torch.nn.Tanh(),
        torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2),
    )  # fmt: skip
    model[5].weight = model[3].weight
    return model


def _resume(
    rank: int, world: int, ckpt: str, stage: int, dtype: str, config: dict, steps: int
) -> list[float]:
    import ds_engine

    model = _model(dtype)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-2
    )
    micro = GLOBAL_BATCH // world
    config = {**config, "train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": stage}}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    engine, *_ = ds_engine.initialize(model=model, optimizer=optimizer, config=config)
    path, client = engine.load_checkpoint(ckpt, "global_step3")
    assert client == {"epoch": 2, "note": "fixture", "best_loss": 0.25} and engine.global_steps == 3
    engine.module.eval()  # as DeepSpeed's continuation: BatchNorm uses the loaded running statistics
    losses = []
    for step in range(steps):
        batch = torch.randn(GLOBAL_BATCH, 4, generator=torch.Generator().manual_seed(RESUME_SEED + step))
        x = batch[micro * rank : micro * (rank + 1)].to(next(engine.module.parameters()).dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world)
    return losses


# one case per thing that can differ (ds's stage, ds's world size, the dtype): each costs CI a launch of ranks
@pytest.mark.parametrize(
    "case,stage,world", [("zero3_fp32", 3, 2), ("zero3_fp32", 2, 1), ("zero3_bf16", 3, 1)],
)  # fmt: skip
def test_resumed_engine_continues_like_deepspeed(tmp_path, case, stage, world):
    facts = json.loads((FIXTURES / case / "expected.json").read_text())
    load_deepspeed(FIXTURES / case / "ckpt").save(tmp_path, "global_step3")
    theirs = facts["resume_losses"]
    ours = spawn(_resume, world, str(tmp_path), stage, facts["dtype"], facts["config"], len(theirs))[0]
    # bf16: the same bf16 roundings in another reduction order drift by a few units of bf16's last place
    rtol = 1e-5 if facts["dtype"] == "fp32" else 2e-2
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=0)

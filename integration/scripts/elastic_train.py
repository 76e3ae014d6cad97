"""An elastic training job: the config's ``elasticity`` section fixes the global batch at any world size.

Usage: elastic_train.py OUT STEPS [--save-every N] [--step-seconds S]. Resumes from OUT/ckpt when it holds a
checkpoint (``ds-launch --elastic`` restarts it there after a lost host). Step s trains on the same global
batch (samples s*B .. (s+1)*B-1, B the elastic batch) whatever the world size: each rank takes its share of
every micro step. Rank 0 appends ``{"step", "loss", "world", "micro", "gas", "restart"}`` to OUT/losses.jsonl
after each step (the loss averaged over the global batch), and a line ``{"resumed": step}`` after a load.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import ds_engine
import torch
import torch.distributed as dist

CONFIG = {
    "elasticity": {"enabled": True, "max_train_batch_size": 8, "micro_batch_sizes": [2, 4], "min_gpus": 1,
                   "max_gpus": 4, "version": 0.1},
    "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 1},
}  # fmt: skip


def samples(first: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples first .. first+n-1, each from its own seed: the same data whatever the split."""
    xs, ys = [], []
    for i in range(first, first + n):
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(16, generator=g)
        xs.append(x)
        ys.append(int((x.sum() * 7).abs()) % 8)
    return torch.stack(xs), torch.tensor(ys)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("steps", type=int)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--step-seconds", type=float, default=0.0)
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()
    ds_engine.init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 8))
    engine, *_ = ds_engine.initialize(model=model, config=CONFIG)
    rank, world = dist.get_rank(), dist.get_world_size()
    batch, micro, gas = (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                         engine.gradient_accumulation_steps())  # fmt: skip
    ckpt, log = args.out / "ckpt", args.out / "losses.jsonl"
    step = 0
    if (ckpt / "latest").exists():
        _, state = engine.load_checkpoint(ckpt)
        step = state["step"]
        if rank == 0:
            with log.open("a") as f:
                f.write(json.dumps({"resumed": step, "world": world, "micro": micro, "gas": gas}) + "\n")
    restart = int(os.environ.get("DS_ELASTIC_RESTART", "0"))
    while step < args.steps:
        total = torch.zeros(1)
        for m in range(gas):
            x, y = samples(step * batch + (m * world + rank) * micro, micro)
            loss = torch.nn.functional.cross_entropy(engine(x), y)
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        dist.all_reduce(total)
        step += 1
        if rank == 0:
            with log.open("a") as f:
                f.write(json.dumps({"step": step, "loss": total.item() / (gas * world), "world": world, "t": time.time(),
                                    "micro": micro, "gas": gas, "restart": restart}) + "\n")  # fmt: skip
        if step % args.save_every == 0:
            engine.save_checkpoint(ckpt, tag=f"global_step{step}", client_state={"step": step})
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    main()

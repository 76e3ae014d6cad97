"""A DCGAN-style script with two engines, as users write it (DeepSpeedExamples' gan): one job per mode.

The discriminator's parameters receive gradients during the generator engine's backward; the script
clears them with ``netD.zero_grad()`` on the raw module (mode ``zero_grad``), or leaves them to add
into D's next backward (mode ``accumulate``), or lets them arrive after D's backward and before D's
step (mode ``late``: unaveraged on each rank; the engine's step() refuses them at every stage). Rank 0 writes
D's and G's final weights (or the error) as JSON, one entry per run. Used by test_zero_outside_backward.py.
Several runs share one launch (each builds its own fresh engines), because a launch costs more than a run.
Usage: ds-launch --num_procs W gan_two_engines.py OUT.json STAGE:MODE [STAGE:MODE ...]
"""

from __future__ import annotations

import argparse
import json

import ds_engine
import torch
import torch.distributed as dist
from torch import nn

BATCH = 8  # per rank
STEPS = 4
NOISE = 6


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "steps_per_print": 1000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.02, "betas": [0.5, 0.999]}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 40},
    }


def train(stage: int, mode: str) -> dict:
    """One run: fresh models and engines at ``stage``, trained in ``mode``; D's and G's weights or the error."""
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(NOISE, 16), nn.Tanh(), nn.Linear(16, 5))
    net_d = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 1))
    engine_d, *_ = ds_engine.initialize(model=net_d, config=config(stage))
    engine_g, *_ = ds_engine.initialize(model=net_g, config=config(stage))
    rank = dist.get_rank()
    criterion = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(100 + rank)  # every rank its own data
    error = None
    try:
        for _ in range(STEPS):
            real = torch.randn(BATCH, 5, generator=gen) * 0.5 + 1.0
            noise = torch.randn(BATCH, NOISE, generator=gen)
            if mode != "accumulate":
                net_d.zero_grad()  # clears what G's backward left in D's .grad
            ones, zeros = torch.ones(BATCH, 1), torch.zeros(BATCH, 1)
            fake = engine_g(noise)
            loss_d = criterion(engine_d(real), ones) + criterion(engine_d(fake.detach()), zeros)
            engine_d.backward(loss_d)
            if mode == "late":
                # G's backward runs before D steps: D's parameters get gradients after D's backward
                engine_g.backward(criterion(net_d(fake), ones))
                engine_d.step()
                engine_g.step()
                continue
            engine_d.step()
            net_g.zero_grad()
            engine_g.backward(criterion(engine_d(fake), ones))  # reaches D's parameters too
            engine_g.step()
    except Exception as exc:  # noqa: BLE001 - the test reads the message
        error = f"{type(exc).__name__}: {exc}"
    weights = {f"d.{k}": v.tolist() for k, v in net_d.state_dict().items()}
    weights.update({f"g.{k}": v.tolist() for k, v in net_g.state_dict().items()})
    return {"weights": weights, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+", help="STAGE:MODE, e.g. 1:zero_grad")
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    results = {}
    for run in args.runs:
        stage, mode = run.split(":")
        if mode not in ("zero_grad", "accumulate", "late"):
            parser.error(f"unknown mode {mode!r} in {run!r}: use zero_grad, accumulate or late")
        results[run] = train(int(stage), mode)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()

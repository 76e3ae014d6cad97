"""A DCGAN-style script with two engines, as users write it (DeepSpeedExamples' gan): one job per mode.

The discriminator's parameters receive gradients during the generator engine's backward; the script
clears them with ``netD.zero_grad()`` on the raw module (mode ``zero_grad``), or leaves them to add
into D's next backward (mode ``accumulate``), or lets them arrive after D's backward and before D's
step (mode ``late``: stage 0 applies them to each rank unaveraged; ZeRO must refuse). Rank 0 writes
D's and G's final weights (or the error) as JSON. Used by test_zero_outside_backward.py.
Usage: ds-launch --num_procs W gan_two_engines.py OUT.json STAGE MODE
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("stage", type=int)
    parser.add_argument("mode", choices=["zero_grad", "accumulate", "late"])
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    out, stage, mode = args.out, args.stage, args.mode
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
    if rank == 0:
        weights = {f"d.{k}": v.tolist() for k, v in net_d.state_dict().items()}
        weights.update({f"g.{k}": v.tolist() for k, v in net_g.state_dict().items()})
        with open(out, "w") as f:
            json.dump({"weights": weights, "error": error}, f)


if __name__ == "__main__":
    main()

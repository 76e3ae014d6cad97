"""What the step guard's gradient hooks cost per ``engine.backward``: the same engine timed with them on and
taken off, interleaved, in one run (one rank, ZeRO 0, fp32; many small parameters, the worst case).

    PYTHONPATH=... python tools/bench/bench_step_guard.py [--layers 100] [--reps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=100)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import ds_engine

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(args.layers)])
    config = {"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 1e-4}}}
    engine, *_ = ds_engine.initialize(model=model, config=config)
    x = torch.randn(4, args.width)

    def one() -> float:
        loss = engine(x).pow(2).mean()
        t = time.perf_counter()
        engine.backward(loss)
        elapsed = time.perf_counter() - t
        engine.zero_grad()
        return elapsed

    guard = engine._outside
    on, off = [], []
    for _ in range(20):
        one()
    for _ in range(args.reps):  # interleaved, so that load drifts hit both alike
        on.append(one())
        guard.remove()
        off.append(one())
        guard.__init__(engine.module)  # the hooks back, as the engine installs them
    n = sum(p.requires_grad for p in model.parameters())
    med_on, med_off = statistics.median(on) * 1e6, statistics.median(off) * 1e6
    print(
        f"{n} parameters: engine.backward median {med_on:.0f} us with the guard, {med_off:.0f} us without "
        f"({med_on - med_off:+.0f} us, {(med_on - med_off) / n:+.2f} us per parameter)"
    )


if __name__ == "__main__":
    main()

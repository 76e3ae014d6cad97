#!/usr/bin/env python
"""Engine overhead of ds's ZeRO stages with and without overlap_comm, against an in-process ceiling.

Each rank keeps an identical copy of the model and, before every engine step, times a plain
forward+backward of the copy on the same batch (the ceiling: no communication, no optimizer).
Overhead = median(engine step) - median(ceiling), per case, in one interleaved run (issue 18's method).
Also prints the live tensor bytes on rank 0 after the last step (distinct storages found by walking gc),
with each case in its own job.

    .venv/bin/python tools/bench/bench_zero_overhead.py [--world 2] [--steps 20] [--width 1024]
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 16))


def _live_bytes() -> int:
    gc.collect()
    seen = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _case(rank: int, world: int, width: int, steps: int, stage: int, overlap: bool, bucket: int) -> dict:
    import ds_engine

    cfg = {
        "train_micro_batch_size_per_gpu": 32,
        "steps_per_print": 10**6,
        "zero_optimization": {"stage": stage, "overlap_comm": overlap, "reduce_bucket_size": bucket},
    }
    model = _model(width)
    ceiling = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = ds_engine.initialize(model=model, optimizer=opt, config=cfg)
    g = torch.Generator().manual_seed(rank)
    step_s, ceil_s = [], []
    for i in range(steps + 2):
        x = torch.randn(32, width, generator=g)
        t0 = time.perf_counter()
        ceiling(x).square().mean().backward()
        ceiling.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        engine.backward(engine(x).square().mean())
        engine.step()
        t2 = time.perf_counter()
        if i >= 2:  # warm-up
            ceil_s.append(t1 - t0)
            step_s.append(t2 - t1)
    del ceiling
    live = _live_bytes() if rank == 0 else 0
    return {
        "step_ms": statistics.median(step_s) * 1e3,
        "ceiling_ms": statistics.median(ceil_s) * 1e3,
        "live": live,
    }


def _worker(rank: int, world: int, width: int, steps: int, cases: list) -> list[dict]:
    return [_case(rank, world, width, steps, *c) for c in cases]


def main() -> None:
    from rank_testing import spawn

    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2, help="interleaved passes over every case")
    args = parser.parse_args()
    cases = [
        (0, False, 500_000_000),
        (0, True, 1_000_000),
        (1, False, 500_000_000),
        (1, True, 1_000_000),
        (2, False, 500_000_000),
        (2, True, 1_000_000),
        (2, True, 4_000_000),
    ]
    results: dict[tuple, list[float]] = {c: [] for c in cases}
    live: dict[tuple, int] = {}
    for _ in range(args.repeat):
        for c in cases:  # one job per case, so no case's leftovers count in another's live bytes
            r0 = spawn(_worker, args.world, args.width, args.steps, [c], timeout_s=3000)[0][0]
            results[c].append(r0["step_ms"] - r0["ceiling_ms"])
            live[c] = r0["live"]
    n = sum(p.numel() for p in _model(args.width).parameters())
    print(
        f"world {args.world}, {n / 1e6:.1f}M params, fp32, {args.steps} steps x {args.repeat} passes (rank 0)"
    )
    print("| stage | overlap_comm | reduce_bucket_size | overhead ms (per pass) | live MB after step |")
    print("|---|---|---|---|---|")
    for c in cases:
        per = ", ".join(f"{v:.1f}" for v in results[c])
        print(f"| {c[0]} | {c[1]} | {c[2]:,} | {per} | {live[c] / 1e6:.1f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""gloo: time all_reduce, one reduce per owner, and reduce_scatter_tensor for the same bucket (fp32).

The three give each rank the sum of its slice (all_reduce gives more); ZeRO's reduce_scatter path picks
the one that measures fastest here. Median of 5 timed runs after 2 warm-ups, rank 0.

    .venv/bin/python tools/bench_zero_collectives.py [WORLD]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testing"))


def _time(fn) -> float:
    times = []
    for _ in range(7):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def _work(rank: int, world: int) -> dict:
    out = {}
    for elems in (1 << 18, 1 << 20, 1 << 22, 1 << 24):
        t = torch.randn(elems)
        part = elems // world

        def per_owner(t: torch.Tensor = t, part: int = part) -> None:
            works = [dist.reduce(t[r * part : (r + 1) * part], dst=r, async_op=True) for r in range(world)]
            for w in works:
                w.wait()

        out[elems] = {
            "all_reduce": _time(lambda t=t: dist.all_reduce(t)),
            "reduce_per_owner": _time(per_owner),
            "reduce_scatter_tensor": _time(
                lambda t=t, part=part: dist.reduce_scatter_tensor(torch.empty(part), t)
            ),
        }
    return out


def main() -> None:
    from rank_testing import spawn

    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    res = spawn(_work, world, timeout_s=900)[0]
    print("| world | bucket | all_reduce ms | reduce per owner ms | reduce_scatter_tensor ms |")
    print("|---|---|---|---|---|")
    for elems, r in res.items():
        row = " | ".join(f"{r[k]:.1f}" for k in ("all_reduce", "reduce_per_owner", "reduce_scatter_tensor"))
        print(f"| {world} | {elems * 4 // 2**20 or elems * 4 / 2**20} MiB | {row} |")


if __name__ == "__main__":
    main()

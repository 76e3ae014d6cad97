#!/usr/bin/env python
"""The floor under a data-parallel step: each part of it alone, on gloo ranks with one thread each.

Times, as medians over 6 repeats after one warm-up (barrier before each), the collectives a ZeRO step
can use on ``--numel`` fp32 elements (all_reduce, reduce_scatter_tensor, all_gather_into_tensor) and
torch AdamW's step on the whole and on a 1/world partition with torch's CPU default (foreach) and with
``fused=True``, plus one vector norm. Issue 18 compares engine overheads against these parts.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 tools/bench/bench_step_floor.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def median_ms(fn: Callable[[], object], repeats: int = 7) -> float:
    """Median wall time of ``fn`` in ms over ``repeats - 1`` runs after one warm-up, ranks aligned."""
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--numel", type=int, default=13_300_000, help="elements (the lean GPT's 13.3M)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    full = torch.randn(args.numel // world * world)
    part = torch.empty(full.numel() // world)
    res = {
        "all_reduce": median_ms(lambda: dist.all_reduce(full)),
        "reduce_scatter_tensor": median_ms(lambda: dist.reduce_scatter_tensor(part, full)),
        "all_gather_into_tensor": median_ms(lambda: dist.all_gather_into_tensor(full, part)),
        "vector_norm": median_ms(lambda: torch.linalg.vector_norm(full)),
    }
    for share in (1, world):
        p = torch.nn.Parameter(torch.randn(full.numel() // share))
        p.grad = torch.randn_like(p)
        for kernel, kwargs in (("foreach (CPU default)", {}), ("fused=True", {"fused": True})):
            opt = torch.optim.AdamW([p], lr=1e-4, **kwargs)
            opt.step()  # allocate the moments outside the timing
            res[f"AdamW {kernel}, 1/{share} of it"] = median_ms(opt.step)
    if dist.get_rank() == 0:
        print(f"{world} gloo ranks, {full.numel()} fp32 elements, median ms:")
        for name, ms in res.items():
            print(f"  {name:>32}: {ms:8.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

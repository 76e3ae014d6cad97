#!/usr/bin/env python
"""gloo: time each ZeRO collective against the alternatives with the same result, at several bucket sizes.

Reduce-scatter semantics (each rank ends with the sum of its own slice): ``reduce_scatter_tensor``, one
``reduce`` per owner, ``all_reduce`` of the whole bucket (the rank then keeps its slice), and each rank
sending every owner its slice (isend/irecv; the owner adds what it receives, its receive buffer timed too).
All-gather semantics (every rank ends with every rank's slice): ``all_gather_into_tensor``, ``all_gather``
into a list of views, ``all_reduce`` of a buffer filled with -0.0 and this rank's slice written in
(x + -0.0 == x bit for bit, for every x, +0.0 included; the fill is timed with it), and one async
``broadcast`` per owner straight into the views. ds_zero/_comm.py chooses per backend from these figures.
Last, stage 0's all-reduce of a real model's gradients: one flattened bucket against the large gradients
in place (ds_zero/_reducer.py). fp32, median of 11 timed runs after 2 warm-ups, each run as long as its
slowest rank (rank 0 reports after a barrier).

    .venv/bin/python tools/bench/bench_zero_collectives.py --world 2,4 --json bench_zero_collectives.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2] / "testing")]

SIZES_MIB = (1, 4, 16, 64)
REPS = 11  # timed runs per figure (after 2 warm-ups): the machine is shared, so take many
REDUCE = ("reduce_scatter_tensor", "reduce per owner", "all_reduce", "send to owner")
GATHER = (
    "all_gather_into_tensor",
    "all_gather (list of views)",
    "all_reduce of a -0.0-filled buffer",
    "broadcast per owner",
)


def _time(fn) -> float:
    times = []
    for _ in range(REPS + 2):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def _candidates(rank: int, world: int, elems: int) -> dict:
    part = elems // world
    full = torch.randn(part * world)
    out = torch.empty(part)
    mine = torch.randn(part)
    views = list(full.chunk(world))

    def per_owner() -> None:
        works = [dist.reduce(views[r], dst=r, async_op=True) for r in range(world)]
        for w in works:
            w.wait()

    def gather_by_all_reduce() -> None:
        full.fill_(-0.0)
        views[rank].copy_(mine)
        dist.all_reduce(full)

    def send_to_owner() -> None:
        others = [r for r in range(world) if r != rank]
        inbox = torch.empty(len(others), part)
        works = [dist.isend(views[r], dst=r) for r in others]
        works += [dist.irecv(inbox[k], src=r) for k, r in enumerate(others)]
        for w in works:
            w.wait()
        views[rank].add_(inbox.sum(0) if len(others) > 1 else inbox[0])

    def broadcast_per_owner() -> None:
        views[rank].copy_(mine)
        works = [dist.broadcast(views[r], src=r, async_op=True) for r in range(world)]
        for w in works:
            w.wait()

    return {
        "send to owner": send_to_owner,
        "broadcast per owner": broadcast_per_owner,
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(out, full),
        "reduce per owner": per_owner,
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, mine),
        "all_gather (list of views)": lambda: dist.all_gather(views, mine),
        "all_reduce of a -0.0-filled buffer": gather_by_all_reduce,
    }


def _grad_candidates(rank: int, world: int) -> dict:
    """Stage 0's all-reduce of the lean GPT's gradients (tools/bench/_bench_cases.py), averaged into ``.grad``:
    flattened into one new bucket buffer and copied back, or gradients of at least 2**18 elements
    all-reduced where they are and only the rest flattened (ds_zero._reducer.IN_PLACE_MIN_ELEMS)."""
    import _bench_cases as bc

    grads = [torch.randn_like(p) for p in bc.make_model(bc.MODELS["lean"]).parameters()]
    big = [g for g in grads if g.numel() >= 1 << 18]
    small = [g for g in grads if g.numel() < 1 << 18]

    def copy_back(flat: torch.Tensor, into: list[torch.Tensor]) -> None:
        offset = 0
        for g in into:
            torch.mul(flat[offset : offset + g.numel()].view_as(g), 1 / world, out=g)
            offset += g.numel()

    def one_flat_bucket() -> None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        copy_back(flat, grads)

    def large_in_place() -> None:
        flat = torch.cat([g.reshape(-1) for g in small])
        works = [dist.all_reduce(t, async_op=True) for t in [*big, flat]]
        for w in works:
            w.wait()
        torch._foreach_mul_(big, 1 / world)
        copy_back(flat, small)

    return {"one flattened bucket": one_flat_bucket, "large gradients in place": large_in_place}


def _work(rank: int, world: int, sizes_mib: list[int]) -> dict:
    out = {
        mib: {name: _time(fn) for name, fn in _candidates(rank, world, mib * 2**20 // 4).items()}
        for mib in sizes_mib
    }
    out["lean GPT gradients"] = {name: _time(fn) for name, fn in _grad_candidates(rank, world).items()}
    return out


def main() -> None:
    from rank_testing import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_MIB)), help="bucket sizes in MiB")
    parser.add_argument("--json", default="bench_zero_collectives.json", help="where to write the figures")
    args = parser.parse_args()
    report = {"backend": "gloo", "dtype": "fp32", "torch": torch.__version__, "results": []}
    for world in (int(w) for w in args.world.split(",")):
        res = spawn(_work, world, [int(m) for m in args.sizes.split(",")], timeout_s=1800)[0]
        for names, what in ((REDUCE, "reduce-scatter"), (GATHER, "all-gather")):
            print(f"\n{what} semantics, gloo, {world} ranks, ms (fastest in bold)\n")
            print("| bucket | " + " | ".join(names) + " |")
            print("|---|" + "---|" * len(names))
            for mib, r in res.items():
                if not isinstance(mib, int):
                    continue
                best = min(names, key=lambda n: r[n])
                cells = [f"**{r[n]:.1f}**" if n == best else f"{r[n]:.1f}" for n in names]
                print(f"| {mib} MiB | " + " | ".join(cells) + " |")
        grads = res.pop("lean GPT gradients")
        print(f"\nstage 0 all-reduce of the lean GPT's 13.3M gradients, {world} ranks, ms\n")
        print("| " + " | ".join(grads) + " |\n|" + "---|" * len(grads))
        print("| " + " | ".join(f"{v:.1f}" for v in grads.values()) + " |")
        report["results"] += [{"world": world, "mib": mib, "ms": r} for mib, r in res.items()]
        report["results"].append({"world": world, "lean GPT gradients": grads})
        Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"\nevery figure in {args.json}")


if __name__ == "__main__":
    main()

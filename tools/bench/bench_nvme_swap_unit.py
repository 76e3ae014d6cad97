"""The NVMe optimizer step's I/O pattern at several swap-unit sizes, without the optimizer: how fast the disk
serves ds's update when a sub-group is moved in requests of U elements per tensor.

Per unit of U elements it reads the fp32 master and two moments and the bf16 gradient from four files,
sleeps for Adam's measured time on U elements (2.6 ms per 4M, the 1.064B trace), then writes the master,
the moments and the bf16 weights, each wait in turn (``pipeline_read``/``pipeline_write`` off), through
ds's pool (``ds_zero._aio.AsyncFileIO``, DeepSpeed's aio defaults). The files (1 GiB per fp32 tensor)
stay under ``--dir`` for the next run. Prints GB/s of bytes moved per unit size and round. The question
it answers: does moving a whole ``sub_group_size`` sub-group per request (DeepSpeed's unit) beat ds's
former 4M-element views (docs/benchmarks.md, "Swap units of sub_group_size")?

    PYTHONPATH=<packages/*/src> python tools/bench/bench_nvme_swap_unit.py --dir /path/on/the/disk
"""

from __future__ import annotations

import argparse
import os
import time

from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty

TOTAL = 256 << 20  # elements per file
BYTES = {"master": 4, "exp_avg": 4, "exp_avg_sq": 4, "grad": 2, "weight": 2}
READ, WRITE = ("master", "exp_avg", "exp_avg_sq", "grad"), ("master", "exp_avg", "exp_avg_sq", "weight")
ADAM_S_PER_ELEMENT = 0.0026 / (4 << 20)


def rate(io: AsyncFileIO, paths: dict, unit: int) -> float:
    """GB/s of one pass over the files in units of ``unit`` elements, each read and write waited in turn."""
    bufs = {k: aligned_empty(unit * b) for k, b in BYTES.items()}
    t0 = time.perf_counter()
    for i in range(TOTAL // unit):
        for h in [io.read(paths[k], i * unit * BYTES[k], bufs[k]) for k in READ]:
            h.wait()
        time.sleep(ADAM_S_PER_ELEMENT * unit)
        for h in [io.write(paths[k], i * unit * BYTES[k], bufs[k]) for k in WRITE]:
            h.wait()
    moved = (TOTAL // unit) * unit * (sum(BYTES[k] for k in READ) + sum(BYTES[k] for k in WRITE))
    return moved / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="a folder on the disk under test (about 7 GB of files)")
    ap.add_argument(
        "--units", default="4194304,16777216,33554432,50331648,67108864", help="elements per unit"
    )
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    io = AsyncFileIO(AioOptions())
    paths = {k: os.path.join(args.dir, f"{k}.bin") for k in BYTES}
    fill = aligned_empty(64 << 20)
    fill.fill_(1)
    for k, p in paths.items():
        if not os.path.exists(p) or os.path.getsize(p) < TOTAL * BYTES[k]:
            for off in range(0, TOTAL * BYTES[k], fill.numel()):
                io.write(p, off, fill).wait()
    units = [int(u) // 1024 * 1024 for u in args.units.split(",")]  # whole 4 KiB pages for O_DIRECT
    for r in range(args.rounds):
        print(
            f"round {r + 1}: " + ", ".join(f"{u / 1e6:.0f}M {rate(io, paths, u):.2f} GB/s" for u in units),
            flush=True,
        )
    io.close()


if __name__ == "__main__":
    main()

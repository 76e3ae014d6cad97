#!/usr/bin/env python
"""O_DIRECT throughput against the memory alignment of the buffer, on this disk, in one run.

The optimizer step's I/O pattern without Adam: ``--units`` sub-groups of three fp32 tensors of
``--numel`` elements each (a master and two moments, one file per tensor and sub-group), read into three
buffers then written back, each wait in turn, through ds's pool (``ds_zero._aio``, the default ``aio``
section). The buffers are the same size in every variant; only where they start differs: 4 KiB past a 2 MiB
boundary (what a 4 KiB-aligned allocation gives at worst), 64 KiB past it, 1 MiB past it, and on it.
Rounds alternate the variants so the disk's drift falls on all of them alike.

    python tools/bench/bench_nvme_buffer_align.py --dir /work/nvme_bench/align
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import torch
from ds_zero._aio import AioOptions, AsyncFileIO

MIB = 1 << 20
OFFSETS = {"4 KiB past": 4096, "64 KiB past": 64 * 1024, "1 MiB past": MIB, "on": 0}  # a 2 MiB boundary


def buffer_at(nbytes: int, past: int) -> torch.Tensor:
    """``nbytes`` of memory starting ``past`` bytes after a 2 MiB boundary."""
    raw = torch.empty(nbytes + 2 * MIB + past, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % (2 * MIB) + past
    return raw[skip : skip + nbytes]


def one_pass(io: AsyncFileIO, files: list[list[str]], bufs: list[torch.Tensor]) -> tuple[float, float]:
    read_s = write_s = 0.0
    for paths in files:
        t0 = time.perf_counter()
        for h in [io.read(p, 0, b) for p, b in zip(paths, bufs)]:
            h.wait()
        t1 = time.perf_counter()
        for h in [io.write(p, 0, b) for p, b in zip(paths, bufs)]:
            h.wait()
        read_s, write_s = read_s + t1 - t0, write_s + time.perf_counter() - t1
    return read_s, write_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="a folder on the disk to measure (emptied at the end)")
    parser.add_argument("--numel", type=int, default=50_000_000 // 1024 * 1024, help="elements per tensor")
    parser.add_argument("--units", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    os.makedirs(args.dir, exist_ok=True)
    nbytes = args.numel * 4
    variants = {name: [buffer_at(nbytes, past) for _ in range(3)] for name, past in OFFSETS.items()}
    for bufs in variants.values():
        for b in bufs:
            b.fill_(1)
    io = AsyncFileIO(AioOptions())
    files = [[os.path.join(args.dir, f"u{u}.t{k}") for k in range(3)] for u in range(args.units)]
    for paths in files:
        for h in [io.write(p, 0, b) for p, b in zip(paths, variants["on"])]:
            h.wait()
    os.sync()
    gb = args.units * 3 * nbytes / 1e9
    rates: dict[str, dict[str, list[float]]] = {n: {"read": [], "write": []} for n in variants}
    try:
        for r in range(args.rounds):
            for name, bufs in variants.items():
                read_s, write_s = one_pass(io, files, bufs)
                rates[name]["read"].append(gb / read_s)
                rates[name]["write"].append(gb / write_s)
                print(
                    f"round {r + 1}, {name} a 2 MiB boundary: read {gb / read_s:.2f} GB/s, write {gb / write_s:.2f} GB/s"
                )
    finally:
        io.close()
        shutil.rmtree(args.dir, ignore_errors=True)
    print("| buffer start | read GB/s (median; all) | write GB/s (median; all) |\n|---|---|---|")
    for name, rw in rates.items():
        cells = [f"{statistics.median(v):.2f}; {', '.join(f'{x:.2f}' for x in v)}" for v in rw.values()]
        print(f"| {name} a 2 MiB boundary | {cells[0]} | {cells[1]} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"numel": args.numel, "units": args.units, "rates_GBps": rates}, f, indent=1)


if __name__ == "__main__":
    main()

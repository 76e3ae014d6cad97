#!/usr/bin/env python
"""ds's I/O pool against DeepSpeed 0.19.8's async I/O op, outside both engines, on the same files, in one run.

The optimizer step's pattern with its pipelines off: ``--units`` sub-groups of three fp32 tensors of
``--numel`` elements (master and two moments, one file per tensor and sub-group, as DeepSpeed lays them
out), each sub-group read into three buffers, waited, written back, waited. Once through ds's pool
(``ds_zero._aio.AsyncFileIO`` with DeepSpeed's aio defaults: 1 MiB blocks, queue depth 8, one thread) and
once through DeepSpeed's ``aio_handle(block_size=1 MiB, queue_depth=8, single_submit=False,
overlap_events=True, intra_op_parallelism=1)``, into the same 4 KiB-aligned buffers, for ``--rounds``
rounds, which of the two goes first alternating from round to round. Runs in DeepSpeed's venv (its op built there), with ds's packages on the path:

    env -u PYTHONPATH DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR=/tmp/tx_largest \\
        $DS_DEEPSPEED_PYTHON tools/bench/bench_nvme_io_deepspeed.py --dir /path/on/the/disk
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "packages" / name / "src") for name in ("ds-zero", "ds-config")]

import torch  # noqa: E402
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty  # noqa: E402


def one_pass(read, write, wait, files: list[list[str]], bufs: list[torch.Tensor]) -> tuple[float, float]:
    """Seconds reading and seconds writing every sub-group, each direction waited in turn."""
    read_s = write_s = 0.0
    for paths in files:
        t0 = time.perf_counter()
        wait([read(b, p) for p, b in zip(paths, bufs)])
        t1 = time.perf_counter()
        wait([write(b, p) for p, b in zip(paths, bufs)])
        read_s, write_s = read_s + t1 - t0, write_s + time.perf_counter() - t1
    return read_s, write_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", required=True, help="a folder on the disk to measure (removed at the end)")
    parser.add_argument("--numel", type=int, default=50_000_000, help="elements per tensor")
    parser.add_argument("--units", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from deepspeed.ops.op_builder import AsyncIOBuilder

    os.makedirs(args.dir, exist_ok=True)
    bufs = [aligned_empty(args.numel * 4).view(torch.float32).normal_() for _ in range(3)]
    files = [[os.path.join(args.dir, f"u{u}.t{k}") for k in range(3)] for u in range(args.units)]
    pool = AsyncFileIO(AioOptions())
    handle = AsyncIOBuilder().load().aio_handle(1 << 20, 8, False, True, 1)

    def pool_wait(handles):
        for h in handles:
            h.wait()

    engines = {
        "ds pool": (lambda b, p: pool.read(p, 0, b), lambda b, p: pool.write(p, 0, b), pool_wait),
        "DeepSpeed aio_handle": (handle.async_pread, handle.async_pwrite, lambda _: handle.wait()),
    }
    try:
        pool_wait([pool.write(p, 0, b) for paths in files for p, b in zip(paths, bufs)])
        os.sync()
        gb = args.units * 3 * args.numel * 4 / 1e9
        for r in range(args.rounds):
            order = list(engines.items())  # who goes first alternates: the first of a round can be slower
            for name, (read, write, wait) in order[:: 1 if r % 2 == 0 else -1]:
                read_s, write_s = one_pass(read, write, wait, files, bufs)
                print(
                    f"round {r + 1}, {name}: read {gb / read_s:.2f} GB/s, write {gb / write_s:.2f} GB/s",
                    flush=True,
                )
    finally:
        pool.close()
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Reading and writing at once: ds's I/O pool against Linux AIO (python-libaio), side by side.

Reads 4 x 256 MiB and writes 4 x 256 MiB at the same time, O_DIRECT, 1 MiB requests: ds's thread pool
(``ds_zero._aio.AsyncFileIO``, ``--thread-count`` x 8 workers) and python-libaio 0.9.5 (one
context, up to 8/16/32 requests in the kernel, reads and writes interleaved), twice each. python-libaio is
not a dependency of ds: ``pip install --target /tmp/pl/site libaio`` and put that folder first on
PYTHONPATH. The question it answers: does a kernel-AIO path read and write at once faster than ds's pool
on this disk (docs/benchmarks.md, "The final main at 1.064B")?

    PYTHONPATH=/tmp/pl/site:<packages/*/src> python tools/bench/bench_nvme_rw_at_once.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty

N, BS = 256 << 20, 1 << 20  # bytes per file, per request


def pool(io: AsyncFileIO, reads: list, writes: list) -> float:
    """GB/s of ds's pool reading ``reads`` and writing ``writes`` (path, buffer) at once."""
    t0 = time.perf_counter()
    handles = [io.read(f, 0, b) for f, b in reads] + [io.write(f, 0, b) for f, b in writes]
    for h in handles:
        h.wait()
    return (len(reads) + len(writes)) * N / (time.perf_counter() - t0) / 1e9


def kernel_aio(depth: int, reads: list, writes: list) -> float:
    """GB/s of the same through one Linux AIO context, reads and writes interleaved, <= ``depth`` in flight."""
    import libaio

    files = {f: os.fdopen(os.open(f, os.O_RDWR | os.O_DIRECT), "r+b", buffering=0) for f, _ in reads + writes}

    def blocks(mode, pairs: list) -> list:
        return [(mode, f, b.numpy()[o : o + BS], o) for f, b in pairs for o in range(0, N, BS)]

    rd, wr = blocks(libaio.AIOBLOCK_MODE_READ, reads), blocks(libaio.AIOBLOCK_MODE_WRITE, writes)
    order = [x for pair in zip(rd, wr) for x in pair]
    ctx = libaio.AIOContext(depth)
    t0 = time.perf_counter()
    in_flight = issued = done = 0
    while done < len(order):
        batch = []
        while issued < len(order) and in_flight + len(batch) < depth:
            mode, f, a, o = order[issued]
            issued += 1
            batch.append(libaio.AIOBlock(mode, files[f], [memoryview(a)], o))
        if batch:
            in_flight += ctx.submit(batch)
        events = ctx.getEvents(min_nr=1)
        for _block, res, res2 in events:
            assert res == BS, (res, res2)
        in_flight -= len(events)
        done += len(events)
    elapsed = time.perf_counter() - t0
    ctx.close()
    for fh in files.values():
        fh.close()
    return len(order) * BS / elapsed / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/path/on/the/disk", help="a folder on the disk to measure")
    ap.add_argument("--thread-count", type=int, default=1, help="ds pool: aio.thread_count (x queue_depth 8)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    torch.set_num_threads(1)
    io = AsyncFileIO(AioOptions(thread_count=args.thread_count))
    reads = [(f"{args.dir}/r{i}.bin", aligned_empty(N).fill_(3)) for i in range(4)]
    writes = [(f"{args.dir}/w{i}.bin", aligned_empty(N).fill_(5)) for i in range(4)]
    for f, b in reads + writes:
        io.write(f, 0, b).wait()
    os.sync()
    for _ in range(2):
        print(f"ds pool, {io.workers} workers: {pool(io, reads, writes):.2f} GB/s read+write at once")
        for depth in (8, 16, 32):
            print(f"libaio, depth {depth}: {kernel_aio(depth, reads, writes):.2f} GB/s read+write at once")
    io.close()
    for f, _ in reads + writes:
        os.remove(f)


if __name__ == "__main__":
    main()

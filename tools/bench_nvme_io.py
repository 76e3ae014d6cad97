"""Sequential read/write bandwidth of the I/O layers NVMe offload could use, on this disk, side by side.

Candidates: ds's thread pool over ``os.preadv``/``os.pwritev`` (``ds_zero._aio``), with and without
O_DIRECT and with 1 or 4 threads; and the reference figures of ``fio`` (libaio, O_DIRECT, iodepth 8) and ``dd`` (O_DIRECT) on the same file system.
Buffered reads are measured after ``posix_fadvise(DONTNEED)`` so that they come from the disk.

    python tools/bench_nvme_io.py --dir /work/nvme_bench --size-mib 1024
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import time

import torch
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def bench_pool(path: str, buf: torch.Tensor, threads: int, direct: bool, block: int) -> dict:
    if os.path.exists(path):
        os.unlink(path)
    io = AsyncFileIO(AioOptions(block_size=block, queue_depth=8, thread_count=threads, direct=direct))
    t0 = time.perf_counter()
    io.write(path, 0, buf).wait()
    os.fsync(io.open(path).fd)
    tw = time.perf_counter() - t0
    _drop(path)
    t0 = time.perf_counter()
    io.read(path, 0, buf).wait()
    tr = time.perf_counter() - t0
    io.close()
    os.unlink(path)
    return {"write_MBps": buf.numel() / tw / 1e6, "read_MBps": buf.numel() / tr / 1e6}


def bench_fio(path: str, size_mib: int) -> dict:
    out = {}
    for rw in ("write", "read"):
        cmd = ["fio", "--name=seq", f"--filename={path}", f"--size={size_mib}M", "--bs=1M", f"--rw={rw}",
               "--direct=1", "--ioengine=libaio", "--iodepth=8", "--output-format=json"]  # fmt: skip
        res = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        out[f"{rw}_MBps"] = res["jobs"][0][rw]["bw_bytes"] / 1e6
    os.unlink(path)
    return out


def bench_dd(path: str, size_mib: int) -> dict:
    out = {}
    for name, args in (
        ("write", ["if=/dev/zero", f"of={path}", "oflag=direct", "conv=fsync"]),
        ("read", [f"if={path}", "of=/dev/null", "iflag=direct"]),
    ):
        res = subprocess.run(["dd", *args, "bs=1M", f"count={size_mib}"], capture_output=True, text=True)
        m = re.search(r"copied, ([\d.]+) s", res.stderr)
        out[f"{name}_MBps"] = size_mib * (1 << 20) / float(m.group(1)) / 1e6 if m else float("nan")
    os.unlink(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default="/work/nvme_bench")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--block", type=int, default=1 << 20)
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "bench.bin")
    buf = aligned_empty(args.size_mib << 20)
    buf.copy_(torch.randint(0, 255, (buf.numel(),), dtype=torch.uint8))
    rows = {
        "fio libaio O_DIRECT qd8": bench_fio(path, args.size_mib),
        "dd O_DIRECT": bench_dd(path, args.size_mib),
        "ds pool 1 thread O_DIRECT": bench_pool(path, buf, 1, True, args.block),
        "ds pool 4 threads O_DIRECT": bench_pool(path, buf, 4, True, args.block),
        "ds pool 4 threads buffered": bench_pool(path, buf, 4, False, args.block),
    }
    shutil.rmtree(args.dir, ignore_errors=True)
    print(
        f"{'layer':30s} {'write MB/s':>11s} {'read MB/s':>10s}   ({args.size_mib} MiB, {args.block} B requests)"
    )
    for name, r in rows.items():
        if r is None:
            print(f"{name:30s} {'not importable':>22s}")
        else:
            print(f"{name:30s} {r['write_MBps']:11.0f} {r['read_MBps']:10.0f}")


if __name__ == "__main__":
    main()

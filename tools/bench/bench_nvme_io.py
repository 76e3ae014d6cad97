"""Sequential read/write bandwidth of the I/O layers NVMe offload could use, on this disk, side by side.

Candidates: ds's thread pool over ``os.preadv``/``os.pwritev`` (``ds_zero._aio``), with and without
O_DIRECT, at several ``thread_count`` x ``queue_depth`` (the pool's workers) and block sizes, reading,
writing, and reading one file while writing another (what the optimizer step does); and the reference
figures of ``fio`` (libaio, O_DIRECT, iodepth 8 and 32) and ``dd`` (O_DIRECT) on the same file system.
Buffered reads are measured after ``posix_fadvise(DONTNEED)`` so that they come from the disk.

    python tools/bench/bench_nvme_io.py --dir /path/on/the/disk --size-mib 1024
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import torch
from _record import provenance, write  # tools/bench: this script's folder, first on sys.path
from ds_zero._aio import AioOptions, AsyncFileIO, aligned_empty


def _drop(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def bench_pool(path: str, buf: torch.Tensor, threads: int, direct: bool, block: int, depth: int = 1) -> dict:
    if os.path.exists(path):
        os.unlink(path)
    io = AsyncFileIO(AioOptions(block_size=block, queue_depth=depth, thread_count=threads, direct=direct))
    t0 = time.perf_counter()
    io.write(path, 0, buf).wait()
    os.fsync(io.open(path).fd)
    tw = time.perf_counter() - t0
    _drop(path)
    t0 = time.perf_counter()
    io.read(path, 0, buf).wait()
    tr = time.perf_counter() - t0
    other = aligned_empty(buf.numel())  # read the file while writing a second one, as the step does
    t0 = time.perf_counter()
    reading, writing = io.read(path, 0, other), io.write(path + ".2", 0, buf)
    reading.wait()
    writing.wait()
    trw = time.perf_counter() - t0
    io.close()
    os.unlink(path)
    os.unlink(path + ".2")
    return {"write_MBps": buf.numel() / tw / 1e6, "read_MBps": buf.numel() / tr / 1e6,
            "rw_MBps": 2 * buf.numel() / trw / 1e6}  # fmt: skip


def bench_fio(path: str, size_mib: int, depth: int = 8) -> dict:
    out = {}
    for rw in ("write", "read"):
        cmd = ["fio", "--name=seq", f"--filename={path}", f"--size={size_mib}M", "--bs=1M", f"--rw={rw}",
               "--direct=1", "--ioengine=libaio", f"--iodepth={depth}", "--output-format=json"]  # fmt: skip
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
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ds-bench-nvme"))
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument(
        "--repeats", type=int, default=3, help="rounds over every layer; the figure is the median"
    )
    ap.add_argument("--json", default=None, help="write the record (tools/bench/_record.py's envelope) here")
    args = ap.parse_args()
    started = provenance()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, "bench.bin")
    buf = aligned_empty(args.size_mib << 20)
    buf.copy_(torch.randint(0, 255, (buf.numel(),), dtype=torch.uint8))
    mib = 1 << 20
    layers = {
        "fio libaio O_DIRECT qd8": lambda: bench_fio(path, args.size_mib),
        "fio libaio O_DIRECT qd32": lambda: bench_fio(path, args.size_mib, 32),
        "dd O_DIRECT": lambda: bench_dd(path, args.size_mib),
        "ds pool 1x1 O_DIRECT 1M": lambda: bench_pool(path, buf, 1, True, mib),
        "ds pool 4x1 O_DIRECT 1M": lambda: bench_pool(path, buf, 4, True, mib),
        "ds pool 4x8 O_DIRECT 1M": lambda: bench_pool(path, buf, 4, True, mib, 8),
        "ds pool 4x1 O_DIRECT 4M": lambda: bench_pool(path, buf, 4, True, 4 * mib),
        "ds pool 4x8 O_DIRECT 4M": lambda: bench_pool(path, buf, 4, True, 4 * mib, 8),
        "ds pool 4x1 buffered 1M": lambda: bench_pool(path, buf, 4, False, mib),
    }
    runs: dict[str, list[dict]] = {name: [] for name in layers}
    for _ in range(args.repeats):  # round by round: the disk's mood of the minute hits every layer alike
        for name, bench in layers.items():
            runs[name].append(bench())
    shutil.rmtree(args.dir, ignore_errors=True)
    rows = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    print(f"{'layer (threads x queue_depth, block)':38s} {'write MB/s':>11s} {'read MB/s':>10s} "
          f"{'read+write MB/s':>16s}   ({args.size_mib} MiB, median of {args.repeats})")  # fmt: skip
    for name, r in rows.items():
        rw = f"{r['rw_MBps']:16.0f}" if "rw_MBps" in r else f"{'-':>16s}"
        print(f"{name:38s} {r['write_MBps']:11.0f} {r['read_MBps']:10.0f} {rw}")
    write(
        args.json,
        {"settings": vars(args) | {"dir": "<--dir>"}, "median_MBps": rows, "runs_MBps": runs},
        started,
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Per-phase RSS of a ZeRO-3-layout rank (ds stage 3 or FSDP2): where a step's memory peak comes from.

Builds tools/bench/_bench_cases.py's GPT on ``WORLD_SIZE`` gloo ranks (fp32, client torch AdamW, clipping
1.0) the way each implementation's users do (inside ``ds_engine.zero.Init`` for ds, on the meta device
for FSDP2, see ``_bench_cases.build_model``) and prints rank 0's RSS in MB after building and wrapping,
and the peak RSS (VmHWM, reset before each phase through /proc/self/clear_refs) of each forward,
backward and step, plus the RSS after each. Compare with the ZeRO-3 formula (16 bytes per parameter /
N) plus the interpreter's baseline (the "built" figure minus one weight partition).

``--live`` adds, at every "after" point, the bytes of live tensor storages (``_bench_memory``): RSS
minus live bytes is the heap the allocator kept (freed but not returned) plus the interpreter.
``--trim`` calls glibc's ``malloc_trim(0)`` at every "after" point and prints the RSS after it too: the
difference is freed heap glibc had kept.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 tools/bench/trace_stage3_rss.py \\
        --zero '{"stage3_max_live_parameters": 60000000, "stage3_max_reuse_distance": 0}'
    # the same with --impl fsdp2: FSDP2 (fully_shard per block and at the root) on the same model
    # the same with --no-foreach: torch AdamW's per-parameter loop instead of its foreach temporaries
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _bench_cases import ModelDims, _fsdp2, batch, build_model, engine_config  # noqa: E402
from _bench_memory import current_rss_bytes, live_tensor_bytes, peak_rss_bytes, reset_peak_rss  # noqa: E402

_MB = 1 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]  # fmt: skip


def malloc_in_use_bytes() -> int:
    """Bytes glibc's malloc has handed out and not had back (every arena, mmapped chunks included):
    unlike live tensor bytes it counts what autograd saved for backward; unlike RSS, no freed heap."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


class _Trace:
    """Rows of (phase, MB); "after" points optionally add live tensor bytes and the RSS after a trim."""

    def __init__(self, live: bool, trim: bool) -> None:
        self.rows: list[tuple[str, str]] = []
        self.live, self.trim = live, trim

    def peak(self, phase: str) -> None:
        self.rows.append((phase, f"{peak_rss_bytes() // _MB}"))

    def now(self, phase: str) -> None:
        text = f"{current_rss_bytes() // _MB}"
        if self.live:
            text += (
                f"  (live tensors {live_tensor_bytes() // _MB}, malloc in use {malloc_in_use_bytes() // _MB})"
            )
        if self.trim:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            text += f"  (after malloc_trim {current_rss_bytes() // _MB})"
        self.rows.append((phase, text))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impl", choices=["ds", "fsdp2"], default="ds")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bucket", type=int, default=30_000_000, help="reduce_bucket_size (ds)")
    parser.add_argument("--zero", default="{}", help="JSON merged into zero_optimization (ds)")
    parser.add_argument("--no-foreach", action="store_true", help="AdamW with foreach=False (ds)")
    parser.add_argument("--live", action="store_true", help="live tensor bytes at each 'after' point")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) at each 'after' point")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    d = ModelDims(
        vocab=16_000, width=args.width, layers=args.layers, heads=args.heads, seq=128, micro_batch=1
    )
    spec = {"impl": args.impl, "stage": 3, "dtype": "fp32",
            "zero": {"reduce_bucket_size": args.bucket, **json.loads(args.zero)}}  # fmt: skip
    trace = _Trace(args.live, args.trim)
    model = build_model(spec, d)
    trace.now("built")
    if args.impl == "ds":
        import ds_engine

        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False if args.no_foreach else None)
        engine, *_ = ds_engine.initialize(model=model, optimizer=opt, config=engine_config(spec, d))
        forward, backward, step = engine, engine.backward, engine.step
    else:
        _, step = _fsdp2(model, spec, d)  # shards in place; step clips, steps and zeroes the grads
        forward, backward = model, lambda loss: loss.backward()
    trace.now("wrapped")
    seconds = []
    for i in range(args.steps):
        idx, tgt = batch(d, rank, i)
        dist.barrier()
        t0 = time.perf_counter()
        reset_peak_rss()
        loss = forward(idx, tgt)
        trace.peak(f"forward {i} peak")
        trace.now(f"after forward {i}")
        reset_peak_rss()
        backward(loss)
        del loss
        trace.peak(f"backward {i} peak")
        trace.now(f"after backward {i}")
        reset_peak_rss()
        step()
        trace.peak(f"step {i} peak")
        seconds.append(time.perf_counter() - t0)  # the trace's own points (gc with --live) included
        trace.now(f"after step {i}")
    if rank == 0:
        n = sum(p.numel() for p in model.parameters()) if args.impl == "fsdp2" else None
        print(f"impl {args.impl}" + (f", {n / 1e6:.1f}M params" if n else ""))
        for phase, text in trace.rows:
            print(f"{phase:>20}: {text} MB")
        print("seconds per step (rank 0): " + ", ".join(f"{t:.1f}" for t in seconds))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

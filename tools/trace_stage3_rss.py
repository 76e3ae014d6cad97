#!/usr/bin/env python
"""Per-phase RSS of a ds ZeRO stage-3 rank: where a step's memory peak comes from.

Builds tools/_bench_cases.py's GPT inside ``ds_engine.zero.Init`` on ``WORLD_SIZE`` gloo ranks (fp32,
client torch AdamW, clipping 1.0) and prints rank 0's RSS in MB after building and wrapping, and the
peak RSS (VmHWM, reset before each phase through /proc/self/clear_refs) of each forward, backward and
step, plus the RSS after each. Compare with the ZeRO-3 formula (16 bytes per parameter / N) plus the
interpreter's baseline (the "built" figure minus one weight partition).

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node 2 tools/trace_stage3_rss.py \\
        --zero '{"stage3_max_live_parameters": 60000000, "stage3_max_reuse_distance": 0}'
    # the same with --no-foreach: torch AdamW's per-parameter loop instead of its foreach temporaries
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _bench_cases import ModelDims, batch, make_model  # noqa: E402


def _status_mb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def main() -> None:
    import ds_engine

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bucket", type=int, default=30_000_000, help="reduce_bucket_size")
    parser.add_argument("--zero", default="{}", help="JSON merged into zero_optimization")
    parser.add_argument("--no-foreach", action="store_true", help="AdamW with foreach=False")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    d = ModelDims(
        vocab=16_000, width=args.width, layers=args.layers, heads=args.heads, seq=128, micro_batch=1
    )
    zero = {"stage": 3, "reduce_bucket_size": args.bucket, **json.loads(args.zero)}
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0, "zero_optimization": zero,
           "steps_per_print": 10**9}  # fmt: skip
    with ds_engine.zero.Init(config_dict_or_path=cfg):
        model = make_model(d)
    trace = [("built", _status_mb("VmRSS"))]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False if args.no_foreach else None)
    engine, *_ = ds_engine.initialize(model=model, optimizer=opt, config=cfg)
    trace.append(("wrapped", _status_mb("VmRSS")))
    for step in range(args.steps):
        idx, tgt = batch(d, rank, step)
        _reset_peak()
        loss = engine(idx, tgt)
        trace.append((f"forward {step} peak", _status_mb("VmHWM")))
        _reset_peak()
        engine.backward(loss)
        trace += [
            (f"backward {step} peak", _status_mb("VmHWM")),
            (f"after backward {step}", _status_mb("VmRSS")),
        ]
        _reset_peak()
        engine.step()
        trace += [(f"step {step} peak", _status_mb("VmHWM")), (f"after step {step}", _status_mb("VmRSS"))]
    if rank == 0:
        for phase, mb in trace:
            print(f"{phase:>20}: {mb} MB")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

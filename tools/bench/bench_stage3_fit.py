#!/usr/bin/env python
"""ZeRO stage 3 memory, measured: live tensor bytes per rank after a step against the ZeRO-3 formula.

Trains a GPT-2 style model (head tied to the token embedding) for ``--steps`` steps on ``--world`` ranks
(gloo, CPU) through ``ds_engine.initialize``; at stage 3 the model is built inside ``ds_engine.zero.Init``,
so it never exists whole on a rank. After the last step each rank walks the live tensors with ``gc``,
sums the bytes of their distinct storages, and reports them with its peak RSS and the formula:

    ZeRO-3 per rank = (2 + 2 + 12) bytes x parameters / N  (bf16 weights, bf16 grads, fp32 master + Adam)
                      + 2 bytes x the persistent (whole) small parameters  (fp32: 4 + 4 + 8, the master is
                      the weight partition)

The GPT is tools/bench/_bench_cases.py's, as in every benchmark. For "the largest model that fits" under
ds stage 3, ds stage 2, DDP and FSDP2 alike, use tools/bench/bench_largest_fit.py (it guards the machine's memory).

    .venv/bin/python tools/bench/bench_stage3_fit.py --world 2 --layers 4 --width 512
    .venv/bin/python tools/bench/bench_stage3_fit.py --world 4 --layers 24 --width 1600 --seq 256   # ~1.2B, lead only

With ``--zero '{"offload_optimizer": {"device": "nvme", "nvme_path": DIR, ...}}'`` (and ``--aio``) each step's
optimizer time and the bytes the swap read and wrote in it are recorded too (I/O efficiency = bytes / step
time against tools/bench/bench_nvme_io.py's bandwidth). ``--impl deepspeed`` runs the same model and config on
DeepSpeed 0.19.8 (``env -u PYTHONPATH DS_ACCELERATOR=cpu $DS_DEEPSPEED_PYTHON tools/bench/bench_stage3_fit.py
--impl deepspeed ...``; bytes moved are not recorded for it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the spawned ranks import the shared modules too
from _bench_cases import GPT, ModelDims  # noqa: E402  (one benchmark GPT for every tool)
from _bench_memory import live_tensor_bytes  # noqa: E402


def formula_bytes(numel: int, persistent_numel: int, world: int, stage: int, bf16: bool) -> int:
    """ZeRO accounting per rank (stage 2: whole 16-bit weights, the rest partitioned)."""
    low = 2 if bf16 else 4
    master = 4 if bf16 else 0  # fp32: the master is the weight partition (stage 3)
    if stage == 3:
        return (low + low + master + 8) * numel // world + low * persistent_numel
    return low * numel + (low + 4 + 8) * numel // world


def worker(rank: int, args: argparse.Namespace, port: int, queue) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.world), LOCAL_WORLD_SIZE=str(args.world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # fmt: skip
    torch.set_num_threads(1)
    if args.impl == "deepspeed":  # the same script on DeepSpeed 0.19.8 (run it with its python)
        import deepspeed as ds_engine
    else:
        import ds_engine

    cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "bf16": {"enabled": args.dtype == "bf16"},
        "zero_optimization": {
            "stage": args.stage,
            "reduce_bucket_size": args.bucket,
            "stage3_param_persistence_threshold": args.threshold,
            **json.loads(args.zero),
        },  # fmt: skip
        "steps_per_print": 10_000,
        **({"aio": json.loads(args.aio)} if args.aio else {}),
    }
    if args.stage != 3:
        del cfg["zero_optimization"]["stage3_param_persistence_threshold"]
    ds_engine.init_distributed()
    torch.manual_seed(0)
    dims = ModelDims(args.vocab, args.width, args.layers, args.heads, args.seq, args.micro_batch)
    if args.stage == 3:
        with ds_engine.zero.Init(config_dict_or_path=cfg):
            model = GPT(dims)
    else:
        model = GPT(dims)
    numel = sum(getattr(p, "ds_shape", p.shape).numel() for p in model.parameters())
    engine, *_ = ds_engine.initialize(model=model, config=cfg)
    g = torch.Generator().manual_seed(rank)
    swap = getattr(engine.optimizer, "swap", None) if args.impl == "ds" else None  # ds's NVMe offload
    steps = []
    for _ in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), generator=g)
        t0 = time.perf_counter()
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        t1 = time.perf_counter()
        io0 = (
            (engine.optimizer.aio.stats.bytes_read, engine.optimizer.aio.stats.bytes_written)
            if swap
            else (0, 0)
        )
        if swap is not None and args.trace and len(steps) == args.steps - 1:  # the last step's timeline
            swap.trace, engine.optimizer.aio.trace = [], []
        engine.step()
        t2 = time.perf_counter()
        io1 = (
            (engine.optimizer.aio.stats.bytes_read, engine.optimizer.aio.stats.bytes_written)
            if swap
            else (0, 0)
        )
        steps.append({"loss": loss.item(), "fwd_bwd_s": t1 - t0, "step_s": t2 - t1,
                      "read_bytes": io1[0] - io0[0], "written_bytes": io1[1] - io0[1]})  # fmt: skip
    del loss
    if swap is not None and args.trace and rank == 0:
        events = [("step", t1, t2, 0), *swap.trace, *engine.optimizer.aio.trace]
        Path(args.trace).write_text(json.dumps([(k, a - t1, b - t1, n) for k, a, b, n in events]))
    persistent = 0
    if args.stage == 3 and args.impl == "ds":
        persistent = sum(s.numel for s in engine.optimizer.params.slots.values() if s.persistent)
    queue.put({
        "rank": rank,
        "params": numel,
        "persistent_params": persistent,
        "live_bytes": live_tensor_bytes(),
        "formula_bytes": formula_bytes(numel, persistent, args.world, args.stage, args.dtype == "bf16"),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "steps": steps,
    })  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--stage", type=int, default=3, choices=(2, 3))
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--bucket", type=int, default=5_000_000, help="reduce_bucket_size (elements)")
    parser.add_argument("--threshold", type=int, default=100_000, help="stage3_param_persistence_threshold")
    parser.add_argument("--zero", default="{}", help="JSON merged into zero_optimization (e.g. stage-3 keys)")
    parser.add_argument("--trace", help="NVMe: write rank 0's last optimizer step timeline (JSON) here")
    parser.add_argument("--impl", default="ds", choices=("ds", "deepspeed"))
    parser.add_argument(
        "--aio", default="", help="JSON of the aio section (NVMe offload), e.g. '{\"thread_count\": 4}'"
    )
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, queue)) for r in range(args.world)]
    for p in procs:
        p.start()
    results = sorted((queue.get(timeout=3600) for _ in procs), key=lambda r: r["rank"])
    for p in procs:
        p.join()
    print(json.dumps({"args": vars(args), "ranks": results}))
    print(
        "\n| stage | ranks | params | live MiB/rank (max) | formula MiB/rank | live/formula | peak RSS MiB (max) |"
    )
    print("|---|---|---|---|---|---|---|")
    live = max(r["live_bytes"] for r in results)
    formula = results[0]["formula_bytes"]
    rss = max(r["peak_rss_bytes"] for r in results)
    print(f"| {args.stage} | {args.world} | {results[0]['params'] / 1e6:.1f}M | {live / 2**20:.1f} | "
          f"{formula / 2**20:.1f} | {live / formula:.3f} | {rss / 2**20:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()

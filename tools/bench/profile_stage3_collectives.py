"""Collectives and step time of ds's ZeRO-2 and ZeRO-3 on the Trainer benchmark's GPT-2, interleaved in one run.

    nice -n 10 python tools/bench/profile_stage3_collectives.py [--steps 30] [--warmup 5] [--profile 25]

The model is tools/bench/bench_frameworks.py's Trainer model (transformers' GPT2LMHeadModel, width 256, 4 layers,
vocabulary 128, 16 tokens, micro batch 2: many small tensors), 2 gloo ranks on this host, fp32, AdamW from
the config, clipping 1.0, DeepSpeed's default stage-3 keys. One engine per stage, stepped alternately (the
machine's load drift hits both alike). Per stage, rank 0 prints the median step time and the median CPU time
its process spent in a step (all its threads: on a loaded machine, where wall time is mostly waiting for a
core, it still tells how much work a step is), the collectives per
step that the host transport (shared memory) ran and, at stage 3, the parameter-gather collectives and
gathered elements per step; with ``--profile N`` also cProfile's top functions over N more steps of
stage 3 (by own time). Needs transformers (the dev environment has it).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def engine(stage: int):
    import ds_engine
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    no_dropout = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=128, n_positions=16, n_embd=256, n_layer=4, n_head=2, **no_dropout)
    )
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.0}},
    }
    return ds_engine.initialize(model=model, model_parameters=model.parameters(), config=config)[0]


def work(rank: int, port: int, opts: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    engines = {stage: engine(stage) for stage in (2, 3)}
    host = engines[3].optimizer.host_transport  # one per process group: both engines use it
    times: dict[int, list[float]] = {2: [], 3: []}
    cpu: dict[int, list[float]] = {2: [], 3: []}  # this process's CPU time (all its threads) per step
    calls = {2: 0, 3: 0}
    params = engines[3].optimizer.params
    gathers = numel = 0
    g = torch.Generator().manual_seed(rank)
    profile = cProfile.Profile()
    for i in range(opts.warmup + opts.steps + opts.profile):
        ids = torch.randint(0, 128, (2, 16), generator=g)
        timed = opts.warmup <= i < opts.warmup + opts.steps
        for stage, e in engines.items():
            profiling = stage == 3 and i >= opts.warmup + opts.steps
            dist.barrier()
            before = (host.calls if host else 0, params.gather_calls, params.gathered_numel)
            if profiling:
                profile.enable()
            start, start_cpu = time.perf_counter(), time.process_time()
            e.backward(e(input_ids=ids, labels=ids).loss)
            e.step()
            elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
            if profiling:
                profile.disable()
            if timed:  # every collective of the step has completed: the step waits for them
                times[stage].append(elapsed)
                cpu[stage].append(elapsed_cpu)
                calls[stage] += (host.calls if host else 0) - before[0]
                if stage == 3:
                    gathers += params.gather_calls - before[1]
                    numel += params.gathered_numel - before[2]
    if rank == 0:
        for stage in (2, 3):
            row = {
                "stage": stage,
                "median_step_ms": round(statistics.median(times[stage]) * 1e3, 2),
                "median_step_cpu_ms": round(statistics.median(cpu[stage]) * 1e3, 2),
                "host_collectives_per_step": calls[stage] / opts.steps,
                "transport": host.kind if host else "torch.distributed",
            }
            if stage == 3:
                row |= {
                    "gather_collectives_per_step": gathers / opts.steps,
                    "gathered_numel_per_step": numel / opts.steps,
                }
            print(json.dumps(row), flush=True)
        if opts.profile:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile", type=int, default=0, help="then this many stage-3 steps under cProfile")
    opts = p.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(work, args=(port, opts), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    sys.exit(main())

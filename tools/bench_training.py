#!/usr/bin/env python
"""Training throughput and memory: ds (through ds_engine.initialize) vs PyTorch DDP (gloo) vs DeepSpeed (CPU).

One run trains a GPT-style model (about 13M parameters: 4 layers, width 384, sequence 256, micro batch
4) on 2 ranks in fp32 and bf16 at ZeRO stages 0/1/2, and prints a markdown table of tokens/s and per-rank
memory against the ZeRO formula. The "ceiling" rows run forward and backward alone on the same 2 ranks
(no gradient communication, no optimizer step): no engine can be faster, so ceiling/DeepSpeed bounds any
engine's speed-up over DeepSpeed. ds and DeepSpeed get the same config and the same client AdamW. When
/work/venvs/deepspeed exists, the real ``deepspeed`` package runs there (DS_ACCELERATOR=cpu), launched as
a subprocess of this script with that venv's python.

    .venv/bin/python tools/bench_training.py [--steps 4] [--warmup 1] [--no-deepspeed]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

VOCAB = 16_000
WIDTH = 384
LAYERS = 4
HEADS = 6
SEQ = 256
MICRO_BATCH = 4
WORLD = 2
LR = 1e-4
CLIP = 1.0
DS_PYTHON = Path("/work/venvs/deepspeed/bin/python")
STAGES = (0, 1, 2)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a 4x MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))  # (B, nh, T, hs)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2 style language model with the output head tied to the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.tok.weight.t()  # (B, T, V)
        return nn.functional.cross_entropy(logits.float().view(-1, VOCAB), targets.reshape(-1))


def make_model(dtype: torch.dtype) -> GPT:
    torch.manual_seed(0)
    return GPT().to(dtype)


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def zero_formula_bytes(numel: int, stage: int, dtype: torch.dtype, world: int) -> int:
    """ZeRO paper accounting per rank: low-precision params + grads (/N at stage 2) + fp32 master
    and Adam's two moments (/N at stages 1 and 2). Stage 0 keeps everything whole."""
    b = torch.tensor([], dtype=dtype).element_size()
    padded = -(-numel // (2 * world)) * 2 * world
    if stage == 0:
        return numel * b * 2 + numel * 8 + (numel * 4 if dtype != torch.float32 else 0)
    grads = padded * b // world if stage == 2 else padded * b
    return numel * b + grads + padded * 12 // world


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed_loop(step_fn, steps: int, warmup: int) -> float:
    """Seconds per optimizer step, measured after warm-up, with the ranks lined up before and after."""
    for i in range(warmup):
        step_fn(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step_fn(warmup + i)
    dist.barrier()
    return (time.perf_counter() - start) / steps


def _config(stage: int, dtype_name: str) -> dict:
    """The config both ds and DeepSpeed run (DeepSpeed 0.19 defaults gradient_clipping to 1.0: explicit here)."""
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": dtype_name == "bf16"},
        "steps_per_print": 10_000,
    }


def _ours_case(rank: int, impl: str, stage: int, dtype: torch.dtype, steps: int, warmup: int) -> dict:
    model = make_model(torch.float32)
    numel = sum(p.numel() for p in model.parameters())
    memory = None
    if impl == "ceiling":  # forward and backward only: no gradient communication, no optimizer step
        model = model.to(dtype)

        def step_fn(i: int) -> None:
            model(*batch(rank, i)).backward()
            model.zero_grad()
    elif impl == "ddp":
        model = model.to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        ddp = nn.parallel.DistributedDataParallel(model)

        def step_fn(i: int) -> None:
            ddp(*batch(rank, i)).backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
    else:
        import ds_engine

        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        dtype_name = "bf16" if dtype == torch.bfloat16 else "fp32"
        engine, *_ = ds_engine.initialize(model=model, optimizer=opt, config=_config(stage, dtype_name))

        def step_fn(i: int) -> None:
            engine.backward(engine(*batch(rank, i)))
            engine.step()

    seconds = _timed_loop(step_fn, steps, warmup)
    if impl == "ds" and stage > 0:
        memory = engine.optimizer.memory_report().total_bytes
    elif impl == "ds":  # stage 0 holds everything whole: weights, grads, fp32 master (bf16) and Adam state
        params = list(engine.module.parameters())
        memory = sum(2 * _nbytes(p) for p in params)
        if dtype != torch.float32:
            memory += sum(4 * p.numel() * 2 for p in params)  # fp32 master + fp32 grad buffer
        memory += sum(
            _nbytes(v)
            for s in engine.basic_optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v)
        )
    return {"seconds_per_step": seconds, "numel": numel, "memory_bytes": memory}


def _ours_worker(rank: int, port: int, cases: list, steps: int, warmup: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = []
    try:
        for impl, stage, dtype_name in cases:
            r = _ours_case(rank, impl, stage, DTYPES[dtype_name], steps, warmup)
            results.append({"impl": impl, "stage": stage, "dtype": dtype_name, **r})
    except Exception as exc:  # the parent waits on the queue: always answer it
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        raise
    queue.put((rank, results))
    dist.destroy_process_group()


def _run_spawned(worker, cases: list, steps: int, warmup: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, port, cases, steps, warmup, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    by_rank = dict(queue.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    failed = [f"rank {r}: {v}" for r, v in by_rank.items() if isinstance(v, str)]
    if failed:
        raise RuntimeError("benchmark worker failed: " + "; ".join(failed))
    return by_rank[0]


# ---------------------------------------------------------------------- the real DeepSpeed
def _ds_worker(rank: int, port: int, cases: list, steps: int, warmup: int, queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
        LOCAL_SIZE=str(WORLD),
    )
    torch.set_num_threads(1)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    results = []
    try:
        results = _ds_cases(rank, cases, steps, warmup)
    except Exception as exc:
        queue.put((rank, f"{type(exc).__name__}: {exc}"))
        raise
    queue.put((rank, results))


def _ds_cases(rank: int, cases: list, steps: int, warmup: int) -> list[dict]:
    import deepspeed

    results = []
    for _, stage, dtype_name in cases:
        model = make_model(torch.float32)
        numel = sum(p.numel() for p in model.parameters())
        config = {**_config(stage, dtype_name), "zero_allow_untested_optimizer": True}
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)

        def step_fn(i: int, engine=engine) -> None:
            idx, tgt = batch(rank, i)
            engine.backward(engine(idx, tgt))
            engine.step()

        seconds = _timed_loop(step_fn, steps, warmup)
        results.append(
            {
                "impl": "deepspeed",
                "stage": stage,
                "dtype": dtype_name,
                "seconds_per_step": seconds,
                "numel": numel,
                "memory_bytes": None,
            }
        )
        del engine
    return results


def _run_deepspeed(cases: list, steps: int, warmup: int) -> list[dict]:
    """Run the DeepSpeed cases in the deepspeed venv; returns [] with a note when it cannot."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    cmd = [
        str(DS_PYTHON),
        __file__,
        "--deepspeed-worker",
        json.dumps({"cases": cases, "steps": steps, "warmup": warmup}),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("DS_RESULTS "):
            return json.loads(line[len("DS_RESULTS ") :])
    print(f"deepspeed run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
    return []


def _collectives_worker(rank: int, port: int, cases: list, steps: int, warmup: int, queue) -> None:
    """Time the gloo collectives that could carry ZeRO's reduce-scatter and gather on 8 MiB of fp32."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    n = 1 << 20
    full, part = torch.randn(n * WORLD), torch.empty(n)
    chunks = list(full.chunk(WORLD))
    candidates = {
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part, full),
        "reduce_scatter (list)": lambda: dist.reduce_scatter(part, chunks),
        "reduce to each owner": lambda: [dist.reduce(c, dst=r) for r, c in enumerate(chunks)],
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, part),
        "all_gather (list)": lambda: dist.all_gather(chunks, part),
        "broadcast from each owner": lambda: [dist.broadcast(c, src=r) for r, c in enumerate(chunks)],
    }
    results = []
    for name, fn in candidates.items():
        seconds = _timed_loop(lambda _i, fn=fn: fn(), steps, warmup)
        results.append({"collective": name, "ms": seconds * 1e3})
    queue.put((rank, results))
    dist.destroy_process_group()


def _table(results: list[dict], steps: int, warmup: int) -> str:
    tokens = WORLD * MICRO_BATCH * SEQ
    ddp = {r["dtype"]: r["seconds_per_step"] for r in results if r["impl"] == "ddp"}
    ds = {(r["stage"], r["dtype"]): r["seconds_per_step"] for r in results if r["impl"] == "deepspeed"}
    lines = [
        f"tokens per optimizer step: {tokens} ({WORLD} ranks x micro batch {MICRO_BATCH} x seq {SEQ}); "
        f"{steps} timed steps after {warmup} warm-up; params {results[0]['numel'] / 1e6:.2f}M",
        "",
        "| impl | stage | dtype | tokens/s | vs DDP | vs deepspeed | rank-0 memory MiB | ZeRO formula MiB | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        tps = tokens / r["seconds_per_step"]
        vs_ddp = ddp[r["dtype"]] / r["seconds_per_step"] if r["dtype"] in ddp else float("nan")
        ds_s = ds.get((r["stage"], r["dtype"]))
        vs_ds = f"{ds_s / r['seconds_per_step']:.2f}x" if ds_s and r["impl"] == "ds" else ""
        mem = formula = ratio = ""
        if r["memory_bytes"] is not None:
            f = zero_formula_bytes(r["numel"], r["stage"], DTYPES[r["dtype"]], WORLD)
            mem, formula, ratio = (
                f"{r['memory_bytes'] / 2**20:.1f}",
                f"{f / 2**20:.1f}",
                f"{r['memory_bytes'] / f:.3f}",
            )
        stage = r["stage"] if r["impl"] not in ("ddp", "ceiling") else "-"
        lines.append(
            f"| {r['impl']} | {stage} | {r['dtype']} | {tps:.0f} | {vs_ddp:.2f}x | {vs_ds} | {mem} | "
            f"{formula} | {ratio} |"
        )
    ceiling = {r["dtype"]: r["seconds_per_step"] for r in results if r["impl"] == "ceiling"}
    bounds = [
        f"{dtype} stage {stage}: {seconds / ceiling[dtype]:.2f}x"
        for (stage, dtype), seconds in sorted(ds.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        if dtype in ceiling
    ]
    if bounds:  # no engine can beat forward+backward alone: this bounds any speed-up over DeepSpeed
        lines += ["", "ceiling (forward+backward only) vs deepspeed: " + ", ".join(bounds)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps per case")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per case")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--no-deepspeed", action="store_true", help="skip the real deepspeed comparison")
    parser.add_argument("--collectives", action="store_true", help="only time gloo collectives (8 MiB fp32)")
    parser.add_argument("--deepspeed-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.deepspeed_worker:  # running inside the deepspeed venv
        spec = json.loads(args.deepspeed_worker)
        print(
            "DS_RESULTS " + json.dumps(_run_spawned(_ds_worker, spec["cases"], spec["steps"], spec["warmup"]))
        )
        return
    if args.collectives:
        rows = _run_spawned(_collectives_worker, [], max(args.steps, 10), args.warmup)
        print("| collective (gloo, 2 ranks, 8 MiB fp32) | ms |\n|---|---|")
        print("\n".join(f"| {r['collective']} | {r['ms']:.1f} |" for r in rows))
        return
    dtypes = args.dtypes.split(",")
    ours = [(impl, 0, d) for d in dtypes for impl in ("ceiling", "ddp")]
    ours += [("ds", s, d) for d in dtypes for s in STAGES]
    results = _run_spawned(_ours_worker, ours, args.steps, args.warmup)
    if not args.no_deepspeed and DS_PYTHON.exists():
        results += _run_deepspeed(
            [("deepspeed", s, d) for d in dtypes for s in STAGES], args.steps, args.warmup
        )
    print(_table(results, args.steps, args.warmup))


if __name__ == "__main__":
    main()

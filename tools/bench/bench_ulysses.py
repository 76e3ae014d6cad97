#!/usr/bin/env python
"""DeepSpeed-Ulysses: activation memory per rank at sp 1, 2, 4, and the step time of ds against DeepSpeed 0.19.8.

1. Activation memory: a Ulysses LM (dim 256, 8 heads, 4 layers, ds_tpsp's DistributedAttention around torch's
   causal sdpa) on ``sp`` gloo ranks at one long sequence; the bytes of the tensors autograd saves for backward
   during one forward, per rank (``torch.autograd.graph.saved_tensors_hooks``: the activation memory, not the
   process's RSS, which the shared machine's other jobs would blur). Expected: about 1/sp of sp 1's.
2. Step time: integration/scripts/ulysses/ulysses_train.py (ZeRO 1, sp 2 on 2 ranks, --seq) under ds's
   ``deepspeed`` and under the real DeepSpeed, alternating, ``--runs`` times each; per run the median step after
   the first; reported: the median of those, with the spread.

    python tools/bench/bench_ulysses.py --seq 16384 --time-seq 2048 --runs 3 --deepspeed-python $DS_DEEPSPEED_PYTHON
Writes docs/benchmarks/ulysses.json (command, commit, versions, load average, figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "testing")]
SCRIPT = ROOT / "integration" / "scripts" / "ulysses" / "ulysses_train.py"


def _activation_bytes(rank: int, world: int, seq: int) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from ds_tpsp.sequence import DistributedAttention

    dim, heads, layers = 256, 8, 4

    def attention(q, k, v):
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        ).transpose(1, 2)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.qkv, self.proj = (
                torch.nn.LayerNorm(dim),
                torch.nn.Linear(dim, 3 * dim),
                torch.nn.Linear(dim, dim),
            )
            self.mlp = torch.nn.Sequential(
                torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
            )
            self.attn = DistributedAttention(attention, dist.group.WORLD, 2, 1) if world > 1 else None

        def forward(self, x):
            q, k, v = self.qkv(self.norm(x)).unflatten(-1, (3, heads, -1)).unbind(2)
            a = self.attn(q, k, v, 0) if self.attn is not None else attention(q, k, v)
            x = x + self.proj(a.flatten(2))
            return x + self.mlp(x)

    torch.manual_seed(0)
    blocks = torch.nn.Sequential(*[Block() for _ in range(layers)])
    x = torch.randn(1, seq // world, dim, requires_grad=True)
    seen: dict[int, int] = {}

    def pack(t):
        if t.is_floating_point():  # parameters are saved too: count only what the sequence makes
            key = t.untyped_storage().data_ptr()
            if not any(
                t.untyped_storage().data_ptr() == p.untyped_storage().data_ptr() for p in blocks.parameters()
            ):
                seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        blocks(x).sum().backward()
    return sum(seen.values())


def activation_memory(seq: int) -> dict[str, int]:
    from rank_testing import spawn

    return {f"sp{sp}": spawn(_activation_bytes, sp, seq, timeout_s=3600)[0] for sp in (1, 2, 4)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(python: str, ds: bool, seq: int, steps: int) -> list[float]:
    """2 ranks of the Ulysses script (sp 2, ZeRO 1); rank 0's step seconds."""
    config = {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 2, "sequence_parallel_size": 2,
              "steps_per_print": 1000, "gradient_clipping": 1.0, "zero_optimization": {"stage": 1},
              "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "c.json", Path(tmp) / "o.json"
        cfg.write_text(json.dumps(config))
        port = _free_port()
        procs = []
        for rank in range(2):
            env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                   "OMP_NUM_THREADS": "1"}  # fmt: skip
            if not ds:
                env.pop("PYTHONPATH", None)
            argv = [python, str(SCRIPT), "--deepspeed_config", str(cfg), "--out", str(out), "--seq", str(seq)]
            argv += ["--steps", str(steps)]
            procs.append(
                subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        if any(p.wait(timeout=3600) for p in procs):
            raise RuntimeError(f"{'ds' if ds else 'DeepSpeed'} run failed")
        return json.loads(out.read_text())["step_seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=16384, help="sequence length of the memory measurement")
    parser.add_argument("--time-seq", type=int, default=2048, help="sequence length of the step-time runs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--deepspeed-python",
        default=os.environ.get("DS_DEEPSPEED_PYTHON"),
        help="a python with deepspeed==0.19.8 (default: $DS_DEEPSPEED_PYTHON)",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "ulysses.json"))
    args = parser.parse_args()
    if not args.deepspeed_python:
        parser.error("give --deepspeed-python or set DS_DEEPSPEED_PYTHON (a venv with deepspeed==0.19.8)")
    load = [os.getloadavg()]
    memory = activation_memory(args.seq)
    times: dict[str, list[float]] = {"ds": [], "deepspeed": []}
    for _ in range(args.runs):  # alternating, so the machine's load drift falls on both
        for impl in ("ds", "deepspeed"):
            python = sys.executable if impl == "ds" else args.deepspeed_python
            times[impl].append(
                statistics.median(run_script(python, impl == "ds", args.time_seq, args.steps)[1:])
            )
    load.append(os.getloadavg())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    record = {
        "command": " ".join(["python", "tools/bench/bench_ulysses.py", *sys.argv[1:]]),
        "commit": commit,
        "python": platform.python_version(),
        "load_average": load,
        "activation_bytes_per_rank": {"seq": args.seq, **memory},
        "activation_ratio": {k: round(v / memory["sp1"], 3) for k, v in memory.items()},
        "step_seconds": {"time_seq": args.time_seq, **times},
        "step_median": {k: statistics.median(v) for k, v in times.items()},
        "step_spread": {k: [min(v), max(v)] for k, v in times.items()},
    }
    record["ds_over_deepspeed"] = round(record["step_median"]["ds"] / record["step_median"]["deepspeed"], 3)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

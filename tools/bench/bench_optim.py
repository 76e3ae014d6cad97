"""Benchmark ds-optim: CPU Adam throughput and OneBitAdam communication, side by side, as markdown tables.

CPU Adam (Mparam/s, higher is better) on one flat fp32 parameter of ``--params`` elements with
``--threads`` threads: torch fused AdamW, torch foreach AdamW, ds_optim.CPUAdam (update only; with the bf16
copy in one pass on the Numba kernel; with the copy on the torch two-pass fallback), and DeepSpeed's
compiled DeepSpeedCPUAdam, alone and followed by the bf16 copy_ its ZeRO offload does (0.19.8's step has no
low-precision output), when $DS_DEEPSPEED_PYTHON names a python with DeepSpeed (run there in a subprocess, DS_ACCELERATOR=cpu).
Also the Numba kernel's first-call compile time with an empty cache (in a subprocess).

OneBitAdam at 2 and 4 ranks (gloo, one thread per rank): bytes each rank sends per step and time per
step after freeze_step, against an fp32 all-reduce of the same momentum.

    .venv/bin/python tools/bench/bench_optim.py [--params 50000000] [--threads 2] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import provenance, write  # noqa: E402

# a python with DeepSpeed 0.19.8 installed (DS_DEEPSPEED_PYTHON); absent: its column is n/a
DS_VENV_PYTHON = Path(os.environ.get("DS_DEEPSPEED_PYTHON", "deepspeed-python-not-set"))

# Runs inside the DeepSpeed venv; prints Mparam/s.
DS_SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    torch.set_num_threads(int(sys.argv[2]))
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    n, steps = int(sys.argv[1]), int(sys.argv[3])
    p = torch.nn.Parameter(torch.randn(n)); p.grad = torch.randn(n)
    opt = DeepSpeedCPUAdam([p], lr=1e-3, weight_decay=0.01, adamw_mode=True)
    q = torch.empty(n, dtype=torch.bfloat16)
    for copy in (False, True):
        opt.step()
        t = time.perf_counter()
        for _ in range(steps):
            opt.step()
            if copy:
                q.copy_(p.detach())
        print(n * steps / (time.perf_counter() - t) / 1e6)
    """
)


def _time_steps(step, n_params: int, steps: int) -> float:
    """Mparam/s of ``step()``, after one warm-up call."""
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return n_params * steps / (time.perf_counter() - start) / 1e6


def _torch_adamw(n: int, steps: int, **impl) -> float:
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **impl)
    return _time_steps(opt.step, n, steps)


def _cpu_adam(n: int, steps: int, lowp: bool, one_pass: bool = True) -> float:
    from ds_optim import CPUAdam, _cpu_adam

    load = _cpu_adam._load_numba_adam
    if not one_pass:
        _cpu_adam._load_numba_adam = lambda: None
    try:
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n)
        opt = CPUAdam([p], lr=1e-3, weight_decay=0.01)
        copy = [torch.empty(n, dtype=torch.bfloat16)] if lowp else None
        return _time_steps(lambda: opt.step(lowp_params=copy), n, steps)
    finally:
        _cpu_adam._load_numba_adam = load


# Runs in a fresh interpreter with an empty numba cache; prints the first step's seconds.
COMPILE_SCRIPT = textwrap.dedent(
    """
    import time, torch
    from ds_optim import CPUAdam
    p = torch.nn.Parameter(torch.randn(1024)); p.grad = torch.randn(1024)
    t = time.perf_counter()
    CPUAdam([p]).step(lowp_params=[torch.empty(1024, dtype=torch.bfloat16)])
    print(time.perf_counter() - t)
    """
)


def _numba_compile_s() -> str:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return f"failed: {proc.stderr.strip().splitlines()[-1]}"
    return f"{float(proc.stdout.strip().splitlines()[-1]):.1f} s"


def _deepspeed_cpu_adam(n: int, steps: int, threads: int) -> tuple[str, str]:
    """Mparam/s of DeepSpeedCPUAdam's step, and of its step followed by the bf16 copy."""
    if not DS_VENV_PYTHON.exists():
        return ("n/a (DS_DEEPSPEED_PYTHON not set)",) * 2
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads))
    try:
        proc = subprocess.run(
            [str(DS_VENV_PYTHON), "-c", DS_SCRIPT, str(n), str(threads), str(steps)],
            capture_output=True,
            text=True,
            env=env,
            timeout=480,  # the first use compiles the op (~2 min); a stale build lock would hang forever
        )
    except subprocess.TimeoutExpired:
        return ("timed out (op build lock held?)",) * 2
    if proc.returncode != 0:
        return (f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr else proc.returncode}",) * 2
    alone, with_copy = proc.stdout.strip().splitlines()[-2:]
    return f"{float(alone):.0f}", f"{float(with_copy):.0f}"


def bench_cpu_adam(n: int, threads: int, steps: int, repeats: int) -> tuple[str, dict]:
    """The markdown table (median Mparam/s of ``repeats`` rounds, the implementations alternating round by
    round, with the range) and the record's figures."""
    torch.set_num_threads(threads)
    impls = {
        "torch.optim.AdamW(fused=True)": lambda: _torch_adamw(n, steps, fused=True),
        "torch.optim.AdamW(foreach=True)": lambda: _torch_adamw(n, steps, foreach=True),
        "ds_optim.CPUAdam (update only: torch fused kernel)": lambda: _cpu_adam(n, steps, lowp=False),
        "ds_optim.CPUAdam + bf16 copy, one pass (Numba)": lambda: _cpu_adam(n, steps, lowp=True),
        "ds_optim.CPUAdam + bf16 copy, two passes (fallback without numba)": lambda: _cpu_adam(
            n, steps, lowp=True, one_pass=False
        ),
    }
    ds_names = ("deepspeed DeepSpeedCPUAdam (0.19.8)", "deepspeed DeepSpeedCPUAdam + bf16 copy_ (two passes)")
    rates: dict[str, list] = {name: [] for name in [*impls, *ds_names]}
    for _ in range(repeats):
        for name, run in impls.items():
            rates[name].append(run())
        for name, rate in zip(ds_names, _deepspeed_cpu_adam(n, steps, threads)):
            rates[name].append(float(rate) if rate.replace(".", "", 1).isdigit() else rate)

    def cell(values: list) -> str:
        if not all(isinstance(v, float) for v in values):
            return str(values[-1])
        return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"

    lines = [
        f"CPU Adam, {n / 1e6:.0f}M fp32 params, {threads} threads, {steps} timed steps, "
        f"median of {repeats} alternating rounds (range)",
        "",
        "| implementation | Mparam/s |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {cell(values)} |" for name, values in rates.items()]
    compile_s = _numba_compile_s()
    lines += ["", f"Numba kernel compile, first step with an empty cache: {compile_s}"]
    return "\n".join(lines), {"mparam_per_s": rates, "numba_compile": compile_s}


def _onebit_worker(rank: int, world: int, port: int, numels: list[int], steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from ds_optim import OneBitAdam

    dist.init_process_group("gloo", rank=rank, world_size=world)
    params = [torch.nn.Parameter(torch.randn(n)) for n in numels]
    opt = OneBitAdam(params, freeze_step=1, comm_backend_name="gloo")
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # the warm-up step; compression from here on
    opt.step()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        opt.step()
    onebit_s = (time.perf_counter() - start) / steps
    momenta = [torch.randn(n) for n in numels]
    dist.barrier()
    start = time.perf_counter()
    for _ in range(steps):
        for m in momenta:
            dist.all_reduce(m)
    allreduce_s = (time.perf_counter() - start) / steps
    if rank == 0:
        queue.put((opt.last_step_bytes_sent, opt.fp32_allreduce_bytes(), onebit_s, allreduce_s))
    dist.destroy_process_group()


def bench_onebit(numels: list[int], worlds: list[int], steps: int) -> tuple[str, dict]:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "testing"))
    from rank_testing import free_port

    ctx = mp.get_context("spawn")
    lines = [
        f"OneBitAdam after freeze_step, momentum of {sum(numels) / 1e6:.1f}M elements in {len(numels)} tensors, "
        f"gloo, 1 thread per rank, {steps} timed steps",
        "",
        "| ranks | 1-bit bytes/step/rank | fp32 all-reduce bytes/step/rank | ratio | 1-bit step ms "
        "(incl. Adam update) | fp32 all-reduce ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    found: dict[int, dict] = {}
    for world in worlds:
        queue = ctx.Queue()
        port = free_port()
        procs = [
            ctx.Process(target=_onebit_worker, args=(r, world, port, numels, steps, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        sent, fp32, onebit_s, allreduce_s = queue.get(timeout=900)
        for p in procs:
            p.join()
        lines.append(
            f"| {world} | {sent:,} | {fp32:,} | 1/{fp32 / sent:.1f} | {onebit_s * 1e3:.1f} | {allreduce_s * 1e3:.1f} |"
        )
        found[world] = {"onebit_bytes": sent, "fp32_allreduce_bytes": fp32, "onebit_step_s": onebit_s,
                        "fp32_allreduce_s": allreduce_s}  # fmt: skip
    return "\n".join(lines), found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--params", type=int, default=50_000_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--onebit-numels", type=str, default="4000000,1000000,4096,1")
    parser.add_argument("--onebit-steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="CPU Adam rounds; the figure is the median")
    parser.add_argument(
        "--json", default=None, help="write the record (tools/bench/_record.py's envelope) here"
    )
    args = parser.parse_args()
    started = provenance()
    numels = [int(x) for x in args.onebit_numels.split(",")]
    adam_table, adam = bench_cpu_adam(args.params, args.threads, args.steps, args.repeats)
    print(adam_table, end="\n\n")
    onebit_table, onebit = bench_onebit(numels, [2, 4], args.onebit_steps)
    print(onebit_table)
    write(args.json, {"settings": vars(args), "cpu_adam": adam, "onebit_by_world": onebit}, started)


if __name__ == "__main__":
    main()

"""Two ds ranks on ONE CUDA device over gloo: every ZeRO stage at data-parallel size 2 with CUDA tensors,
each case's losses checked against the same case run on the CPU (gloo, CPU tensors) in the same run.

    python3 tools/gpu/gpu_multirank_check.py --json $OUT/multirank.json            # on a machine with one GPU
    python tools/gpu/gpu_multirank_check.py --device cpu --model tiny --steps 3     # both sides on CPU: the tool

One GPU cannot host two nccl ranks (NCCL refuses two ranks on one device), so each rank joins a gloo group
with ``ds_engine.init_distributed(dist_backend="gloo")`` before ``initialize`` (DeepSpeed's documented way
to pick the backend); ds-launch then places both ranks on ``cuda:0`` (local rank modulo the visible
devices). gloo copies CUDA tensors through the host for the collectives it supports on CUDA. The CPU side
runs with ``CUDA_VISIBLE_DEVICES=""``. Each rank trains on its own batches (tools/bench/_bench_cases.py's
``batch(d, rank, step)``), so the reduction across ranks decides every step after the first.

Before the engine cases, ``gloo <op>`` cases run each collective ds-zero may issue on a CUDA tensor at
world size 2 (and compare its result with the CPU side's), so an engine case that fails can be read
against them. A case that raises or kills its rank is recorded with the error and the rest of the cases
go on in fresh processes. Exit status 1 when any case failed or differs from the CPU side beyond the
tolerance (fp32 ``--rtol``, bf16 ``--rtol-bf16``, relative, per rank and step).
What this does and does not show about nccl: docs/benchmarks.md, "On one GPU".
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

OFFLOAD_OPT = {"offload_optimizer": {"device": "cpu"}}
OFFLOAD_BOTH = {**OFFLOAD_OPT, "offload_param": {"device": "cpu"}}
BF16 = {"bf16": {"enabled": True}}
# name -> ds config keys beyond the common ones (tools/gpu/gpu_engine_check.py's _ds), or None for a gloo probe
CASES: dict[str, dict | None] = {
    "gloo broadcast": None,
    "gloo all_reduce": None,
    "gloo reduce": None,
    "gloo all_gather": None,
    "gloo isend/irecv": None,
    "stage 0 fp32": {"zero_optimization": {"stage": 0}},
    "stage 1 fp32": {"zero_optimization": {"stage": 1}},
    "stage 2 fp32": {"zero_optimization": {"stage": 2}},
    "stage 2 fp32 reduce_scatter=false": {"zero_optimization": {"stage": 2, "reduce_scatter": False}},
    "stage 3 fp32": {"zero_optimization": {"stage": 3}},
    "stage 1 fp32 offload_optimizer": {"zero_optimization": {"stage": 1, **OFFLOAD_OPT}},
    "stage 2 fp32 offload_optimizer": {"zero_optimization": {"stage": 2, **OFFLOAD_OPT}},
    "stage 3 fp32 offload_optimizer+param": {"zero_optimization": {"stage": 3, **OFFLOAD_BOTH}},
    "stage 2 bf16": {"zero_optimization": {"stage": 2}, **BF16},
    "stage 3 bf16": {"zero_optimization": {"stage": 3}, **BF16},
    "stage 3 bf16 offload_optimizer+param": {"zero_optimization": {"stage": 3, **OFFLOAD_BOTH}, **BF16},
}


# --- on each rank -------------------------------------------------------------------------------------
def _probe(name: str, rank: int, device) -> list[float]:
    """One gloo collective on a tensor on ``device``; returns the result's values."""
    import torch
    import torch.distributed as dist

    t = torch.arange(4, dtype=torch.float32, device=device) + 10 * rank
    op = name.split(" ", 1)[1]
    if op == "broadcast":
        dist.broadcast(t, src=1)
    elif op == "all_reduce":
        dist.all_reduce(t)
    elif op == "reduce":
        dist.reduce(t, dst=0)
        t = t if rank == 0 else torch.zeros_like(t)  # only the destination's result is defined
    elif op == "all_gather":
        out = [torch.empty_like(t) for _ in range(2)]
        dist.all_gather(out, t)
        t = torch.cat(out)
    elif op == "isend/irecv":  # what ds-zero's "send" reduction does (each rank sends the other its slice)
        inbox = torch.empty_like(t)
        works = [dist.isend(t, dst=1 - rank, tag=7), dist.irecv(inbox, src=1 - rank, tag=7)]
        for w in works:
            w.wait()
        t = inbox
    return [float(x) for x in t.cpu()]


def _engine_case(extra: dict, rank: int, args: argparse.Namespace, device) -> dict:
    import gc

    # _bench_cases (the benchmarks' models) and gpu_engine_check
    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "bench"), str(Path(__file__).resolve().parent)]
    from _bench_cases import MODELS, batch, make_model
    from gpu_engine_check import _ds

    d = MODELS[args.model]
    fwd_bwd, update, facts = _ds(make_model(d), extra, d, device)
    losses = []
    for step in range(args.steps):
        idx, tgt = (t.to(device) for t in batch(d, rank, step))
        losses.append(float(fwd_bwd(idx, tgt).detach()))
        update()
    out = {"losses": losses, **facts()}
    del fwd_bwd, update, facts
    gc.collect()
    return out


def worker(args: argparse.Namespace) -> None:
    """Run the cases in order on this rank, appending one JSON line per case to ``args.results``."""
    import ds_engine

    topology = ds_engine.init_distributed(
        dist_backend="gloo", timeout=timedelta(seconds=args.collective_timeout)
    )
    with open(args.results, "a") as log:
        for name in args.cases.split(","):
            extra = CASES[name]
            row = {"case": name, "device": str(topology.device), "backend": topology.backend}
            try:
                if extra is None:
                    row["losses"] = _probe(name, topology.rank, topology.device)
                else:
                    row.update(_engine_case(extra, topology.rank, args, topology.device))
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log.write(json.dumps(row) + "\n")
                log.flush()
                raise  # this rank's group may be out of step now: the parent goes on in fresh processes
            log.write(json.dumps(row) + "\n")
            log.flush()


# --- the parent ---------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_side(side: str, cases: list[str], args: argparse.Namespace, tmp: Path) -> dict[str, list[dict]]:
    """Every case on two ranks on ``side`` ("cuda" or "cpu"); returns per case its two ranks' rows. A case
    that fails ends its processes; the cases after it run in fresh ones."""
    results: dict[str, list[dict]] = {}
    remaining = list(cases)
    attempt = 0
    while remaining:
        attempt += 1
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2")
        env.update(LOCAL_WORLD_SIZE="2", DS_ACCELERATOR=side, PYTHONUNBUFFERED="1")
        if side == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""
        base = tempfile.mkdtemp(prefix=f"{side}-{attempt}-", dir=tmp)  # the same side may run twice
        files = [Path(base) / f"rank{r}.jsonl" for r in range(2)]
        logs = [Path(base) / f"rank{r}.log" for r in range(2)]
        cmd = [sys.executable, __file__, "--worker", "--cases", ",".join(remaining), "--model", args.model]
        cmd += ["--steps", str(args.steps), "--collective-timeout", str(args.collective_timeout)]
        procs = [
            subprocess.Popen(
                [*cmd, "--results", str(files[r])],
                env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                stdout=logs[r].open("w"),
                stderr=subprocess.STDOUT,
            )
            for r in range(2)
        ]
        done, last, deadline = -1, time.monotonic(), args.case_timeout
        while any(p.poll() is None for p in procs):
            rows = min(len(_read(f)) for f in files)
            if rows != done:
                done, last = rows, time.monotonic()
            failed = any(p.poll() not in (None, 0) for p in procs)
            if failed or time.monotonic() - last > deadline:
                time.sleep(1.0 if failed else 0)  # the failing rank's peer may still write its row
                for p in procs:
                    p.kill()
                break
            time.sleep(0.2)
        for p in procs:
            p.wait()
        per_rank = [_read(f) for f in files]
        finished = min(len(rows) for rows in per_rank)
        for i in range(finished):
            results[remaining[i]] = [per_rank[0][i], per_rank[1][i]]
        if finished == len(remaining):
            break
        name = remaining[finished]
        rows = [rows[finished] if len(rows) > finished else None for rows in per_rank]
        why = next((r["error"] for r in rows if r and "error" in r), None)
        if why is None:
            codes = [p.returncode for p in procs]
            last_lines = [(log.read_text().strip().splitlines() or [""])[-1] for log in logs]
            why = f"ranks exited {codes} (-9: killed by this script); last lines: {' | '.join(last_lines)[:300]}"
        results[name] = [{"case": name, "error": why}] * 2
        remaining = remaining[finished + 1 :]
    return results


def compare(case: str, dev: list[dict], cpu: list[dict], args: argparse.Namespace) -> tuple[bool, str]:
    """(ok, what) for one case: every rank's losses on the device against the CPU side's."""
    for side, rows in (("device", dev), ("cpu", cpu)):
        if any("error" in r for r in rows):
            return False, f"{side} failed: {next(r['error'] for r in rows if 'error' in r)}"
    rtol = args.rtol_bf16 if "bf16" in case else args.rtol
    worst = 0.0
    for a, b in zip(dev, cpu):
        if len(a["losses"]) != len(b["losses"]):
            return False, f"{len(a['losses'])} values on the device, {len(b['losses'])} on the CPU"
        for x, y in zip(a["losses"], b["losses"]):
            worst = max(worst, abs(x - y) / max(abs(y), 1e-12) if x != y else 0.0)
    return worst <= rtol, f"max rel diff {worst:.2e} (tolerance {rtol:.0e})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="the side checked")
    parser.add_argument("--model", default="small", help="a tools/bench/_bench_cases.py model")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rtol", type=float, default=1e-4, help="fp32 tolerance, relative")
    parser.add_argument("--rtol-bf16", type=float, default=2e-2)
    parser.add_argument("--case-timeout", type=float, default=60, help="seconds a case may take")
    parser.add_argument("--collective-timeout", type=float, default=30)
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    if args.worker:
        worker(args)
        return 0
    with tempfile.TemporaryDirectory(prefix="ds-multirank-") as tmp:
        t0 = time.perf_counter()
        cpu = run_side("cpu", cases, args, Path(tmp))
        t1 = time.perf_counter()
        dev = run_side(args.device, cases, args, Path(tmp))
        t2 = time.perf_counter()
    print(
        f"2 ranks, gloo; model {args.model}, {args.steps} steps; cpu side {t1 - t0:.0f} s, {args.device} side {t2 - t1:.0f} s"
    )
    print(
        "| case | device side on | params / optimizer state on (rank 0) | losses rank 0 / rank 1 (device side) | vs CPU |"
    )
    print("|---|---|---|---|---|")
    rows, bad = [], 0
    for case in cases:
        ok, what = compare(case, dev[case], cpu[case], args)
        bad += not ok
        r0, r1 = dev[case]
        where = f"{r0.get('model_params_on', '-')} / {r0.get('optimizer_state_on', '-')}"
        losses = " / ".join(str([round(x, 4) for x in r.get("losses", [])]) for r in (r0, r1))
        print(
            f"| {case} | {r0.get('device', '-')} {r0.get('backend', '')} | {where} | {losses} | {'ok' if ok else 'FAIL'}: {what} |"
        )
        rows.append({"case": case, "ok": ok, "what": what, "device": dev[case], "cpu": cpu[case]})
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "model": args.model, "rows": rows}))
    print(f"{len(cases) - bad} of {len(cases)} cases match the CPU side")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Engine overhead and memory: ds vs PyTorch DDP vs FSDP2 vs DeepSpeed 0.19.8, side by side in one run.

Every case trains the same GPT (``--model``; the default is the 13.3M-parameter one of docs/benchmarks.md)
with the same config and client AdamW, on ``--world`` ranks over gloo, in fp32 and/or bf16:
ds at ZeRO stages 0-3 (3 only when the installed ds-config accepts it) plus ds's own ZeRO-2 optimizer
offload step and ds at stages 1-2 with ``overlap_comm: true`` (``ds-overlap``: reductions launched from
gradient hooks while backward runs; DeepSpeed's default at these stages, false, reduces after it), DDP, FSDP2 (``fully_shard``), and the real DeepSpeed at stages 0-3 from
$DS_DEEPSPEED_PYTHON (DS_ACCELERATOR=cpu). Each case runs in fresh processes, one per rank.

Speed. Before each engine step, every rank times a plain forward+backward of an identical copy of the
model on the same batch (the *ceiling*: no communication, no optimizer), in the same process, so
launchers and pinning cannot differ between the two. overhead = median(step) - median(ceiling), per
repeat; a step or ceiling lasts as long as its slowest rank. The cases are interleaved within each of
``--repeats`` rounds, so drift in the machine's load hits every implementation alike; the table shows
the median over rounds and the min..max spread of the overhead.

Memory, measured the same way for every implementation on rank 0 (tools/bench/_bench_memory.py): bytes of
every distinct tensor storage alive in the process (gc walk plus module grads/buffers and optimizer
state, deduplicated by storage pointer) after the backward and after the step of one extra step, and
that step's peak RSS. The ZeRO formula is printed next to them, computed separately and labelled.

    .venv/bin/python tools/bench/bench_training.py --world 2 --dtypes fp32 --steps 20 --repeats 3
    .venv/bin/python tools/bench/bench_training.py --model tiny --steps 3 --repeats 1      # checks the tool
    .venv/bin/python tools/bench/bench_training.py --collectives                          # gloo collectives
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parents[1] / "testing")]  # _bench_* modules and rank_testing.spawn

# a python with DeepSpeed 0.19.8 installed (DS_DEEPSPEED_PYTHON); absent: DeepSpeed is skipped
DS_PYTHON = Path(os.environ.get("DS_DEEPSPEED_PYTHON", "deepspeed-python-not-set"))
STAGES = (0, 1, 2, 3)
CASE_TIMEOUT_S = 3600
MIB = 2**20


def zero_formula_bytes(numel: int, stage: int, dtype: str, world: int) -> float:
    """FORMULA, not a measurement: the ZeRO paper's per-rank model-state bytes.

    fp32: weights 4, gradients 4, Adam moments 8 bytes per parameter (the weights are their own master).
    bf16: weights 2, gradients 2, fp32 master + moments 12. Stage >= 1 divides the optimizer part by the
    world size, stage >= 2 also the gradients, stage 3 also the weights.
    """
    weights, grads, optim = (4, 4, 8) if dtype == "fp32" else (2, 2, 12)
    return numel * (
        weights / (world if stage >= 3 else 1)
        + grads / (world if stage >= 2 else 1)
        + optim / (world if stage >= 1 else 1)
    )


def ds_accepts_stage3() -> str | None:
    """None when the installed ds-config accepts ZeRO stage 3, else the reason it gives."""
    from ds_config import ConfigError, load_config

    try:
        load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    except ConfigError as exc:
        return str(exc).strip().splitlines()[-1]
    return None


# ------------------------------------------------------------------ one case, in its own processes
def case_worker(spec: dict) -> None:
    """Entry point of ``--case``: spawn the ranks, combine them, print one CASE_RESULT line."""
    import torch
    from _bench_cases import combine_ranks, run_case
    from rank_testing import spawn

    result = combine_ranks(spawn(run_case, spec["world"], spec, timeout_s=CASE_TIMEOUT_S))
    result["versions"] = {"torch": torch.__version__}
    if spec["impl"] == "deepspeed":
        import deepspeed

        result["versions"]["deepspeed"] = deepspeed.__version__
    print("CASE_RESULT " + json.dumps(result), flush=True)


def mpirun_rank_worker(spec: dict) -> None:
    """Entry point of ``--mpirun-case`` on each rank that ``mpirun`` started: the script joins the job as
    a user's would (``ds_engine.init_distributed``, which finds the ranks through mpi4py), runs the case
    and rank 0 prints the CASE_RESULT line."""
    import ds_engine
    import torch
    import torch.distributed as dist
    from _bench_cases import combine_ranks, run_case

    torch.set_num_threads(1)  # as rank_testing.spawn sets for the other cases
    ds_engine.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result = run_case(rank, world, spec)
    per_rank = [None] * world
    dist.all_gather_object(per_rank, result)
    if rank == 0:
        combined = combine_ranks(per_rank)
        combined["versions"] = {"torch": torch.__version__}
        print("CASE_RESULT " + json.dumps(combined), flush=True)
    dist.destroy_process_group()


def _case_command(spec: dict, python: str) -> list[str]:
    """One case's command: the script itself, or under ``mpirun`` (one process per rank, not pinned to a
    core, as the spawned cases are not) for ``launcher: mpirun``."""
    script = str(Path(__file__).resolve())
    if spec.get("launcher") != "mpirun":
        return [python, script, "--case", json.dumps(spec)]
    mpirun = shutil.which("mpirun", path=str(Path(python).parent)) or "mpirun"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [mpirun, *root, "-np", str(spec["world"]), "--oversubscribe", "--bind-to", "none", python, script,
            "--mpirun-case", json.dumps(spec)]  # fmt: skip


def run_case_subprocess(spec: dict) -> dict:
    """Run one case with the right python (DeepSpeed's venv for DeepSpeed); failures become a row."""
    deepspeed = spec["impl"] == "deepspeed"
    python = str(DS_PYTHON) if deepspeed else sys.executable
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    if spec.get("collectives"):
        env["DS_ZERO_COLLECTIVES"] = spec["collectives"]
    cmd = _case_command(spec, python)
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {CASE_TIMEOUT_S} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("CASE_RESULT "):
            return json.loads(line[len("CASE_RESULT ") :])
    tail = (proc.stderr or proc.stdout)[-2000:]
    print(f"case {case_label(spec)} failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
    return {"error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1] if tail.strip() else ''}"}


def case_label(spec: dict) -> str:
    name = (
        spec["impl"]
        + (" offload" if spec.get("offload") else "")
        + (" overlap" if spec.get("overlap") else "")
        + (" mpirun" if spec.get("launcher") == "mpirun" else "")
        + (" gloo" if spec.get("collectives") == "torch" else "")
        + (" shm" if spec.get("collectives") == "shm" else "")
    )
    return f"{name} stage {spec['stage']}" if spec["impl"] in ("ds", "deepspeed") else name


def plan_cases(args: argparse.Namespace, ds_stages: list[int]) -> list[dict]:
    """One round of cases, ds and DeepSpeed interleaved stage by stage so drift hits both alike."""
    impls = set(args.impls.split(","))
    cases: list[dict] = [{"impl": i, "stage": 0} for i in ("ddp", "fsdp2") if i in impls]
    for stage in STAGES:
        if "ds" in impls and stage in ds_stages:
            cases.append({"impl": "ds", "stage": stage})
        if "deepspeed" in impls and stage in args.stages:
            cases.append({"impl": "deepspeed", "stage": stage})
    # ds under mpirun: ranks from mpi4py, so ZeRO's fp32 collectives go over MPI (ds_zero/_mpi.py)
    cases += [{"impl": "ds", "stage": s, "launcher": "mpirun"} for s in ds_stages if "ds-mpi" in impls]
    # the same mpirun job with shared memory asked for by name instead of MPI (DS_ZERO_COLLECTIVES=shm)
    cases += [
        {"impl": "ds", "stage": s, "launcher": "mpirun", "collectives": "shm"}
        for s in ds_stages
        if "ds-mpi-shm" in impls
    ]
    # ds with every collective on gloo (DS_ZERO_COLLECTIVES=torch): the plain "ds" rows use shared memory
    # between same-host ranks (ds_zero/_shm.py)
    cases += [{"impl": "ds", "stage": s, "collectives": "torch"} for s in ds_stages if "ds-gloo" in impls]
    if "ds-offload" in impls:
        cases.append({"impl": "ds", "stage": 2, "offload": True})
    # ds at stages 1/2 with overlap_comm: true (reductions launched from gradient hooks during backward;
    # false, DeepSpeed's default at these stages, reduces after backward)
    cases += [
        {"impl": "ds", "stage": s, "overlap": True}
        for s in (1, 2)
        if "ds-overlap" in impls and s in ds_stages
    ]
    return cases


# ------------------------------------------------------------------ summary and tables
def progress_line(run: dict, spec: dict, round_: int) -> str:
    """One line per finished case, so that a long run shows (and an interrupted one keeps) its figures."""
    where = f"[{spec['world']} ranks {spec['dtype']} round {round_ + 1}] {case_label(spec)}"
    if "error" in run:
        return f"{where}: failed: {run['error']}"
    step, ceiling = statistics.median(run["step_s"]), statistics.median(run["ceiling_s"])
    return (
        f"{where}: step {_ms(step):.1f} ms, ceiling {_ms(ceiling):.1f} ms, overhead {_ms(step - ceiling):.1f} ms, "
        f"live after step {run['live_bytes_after_step'] / MIB:.1f} MiB"
        + "".join(f", {n} {k} collectives" for k, n in run.get("transport_calls", {}).items() if n)
    )


def _ms(seconds: float) -> float:
    return seconds * 1e3


def summarise(runs: list[dict], world: int, dtype: str) -> dict:
    """Medians over repeats of one case; spread of the overhead over repeats (or over paired steps)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[-1]["error"]}
    step = [statistics.median(r["step_s"]) for r in ok]
    ceiling = [statistics.median(r["ceiling_s"]) for r in ok]
    overhead = [s - c for s, c in zip(step, ceiling)]
    if len(ok) > 1:
        spread = (min(overhead), max(overhead))
    else:  # one round: quartiles of the paired per-step differences
        q = statistics.quantiles([s - c for s, c in zip(ok[0]["step_s"], ok[0]["ceiling_s"])], n=4)
        spread = (q[0], q[2])
    numel = ok[0]["numel"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in ok)

    return {
        "step_ms": _ms(statistics.median(step)),
        "ceiling_ms": _ms(statistics.median(ceiling)),
        "overhead_ms": _ms(statistics.median(overhead)),
        "overhead_spread_ms": [_ms(spread[0]), _ms(spread[1])],
        "live_mib_after_backward": med("live_bytes_after_backward") / MIB,
        "live_mib_after_step": med("live_bytes_after_step") / MIB,
        "peak_rss_mib": med("peak_rss_bytes") / MIB,
        "peak_rss_above_start_mib": statistics.median(
            r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ok
        )
        / MIB,
        "numel": numel,
        "rounds": len(ok),
        "transport_calls": ok[0].get("transport_calls", {}),
    }


def formula_stage(spec: dict) -> int:
    """The ZeRO stage whose formula describes a case: DDP keeps everything whole, FSDP2 shards all."""
    return {"ddp": 0, "fsdp2": 3}.get(spec["impl"], spec["stage"])


def _ratio(ours: float, theirs: float) -> str:
    """A ratio of overheads means nothing when either is not above zero (noise larger than the overhead)."""
    return f"{ours / theirs:.2f}x" if ours > 0 and theirs > 0 else "n/a (an overhead <= 0: noise)"


def table(rows: list[dict], world: int, dtype: str, repeats: int) -> str:
    over = {
        (r["impl"], r["stage"]): r["overhead_ms"]
        for r in rows
        if "error" not in r
        and not r.get("offload")
        and not r.get("overlap")
        and not r.get("launcher")
        and not r.get("collectives")
    }

    def stage_overheads(launcher: str | None, collectives: str | None) -> dict[int, float]:
        return {
            r["stage"]: r["overhead_ms"]
            for r in rows
            if "error" not in r and r.get("launcher") == launcher and r.get("collectives") == collectives
        }

    over_gloo, over_mpi = stage_overheads(None, "torch"), stage_overheads("mpirun", None)
    over_mpi_shm = stage_overheads("mpirun", "shm")
    spread_note = "min..max over rounds" if repeats > 1 else "p25..p75 of per-step step-ceiling"
    lines = [
        f"### {world} ranks, {dtype}",
        "",
        f"| impl | stage | step ms | ceiling ms | overhead ms | spread ({spread_note}) "
        "| ds / DeepSpeed overhead | live MiB after backward | live MiB after step "
        "| peak RSS MiB (above start) | ZeRO formula MiB (formula) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stage = r["stage"] if r["impl"] in ("ds", "deepspeed") else "-"
        if "error" in r:
            lines.append(f"| {case_label(r)} | {stage} | failed: {r['error']} |" + " |" * 8)
            continue
        ratio = ""
        base = over.get(("deepspeed", r["stage"]))
        if r["impl"] == "ds" and not r.get("offload") and base is not None:
            ratio = _ratio(r["overhead_ms"], base)
        formula = zero_formula_bytes(r["numel"], formula_stage(r), dtype, world) / MIB
        name = case_label(r).rsplit(" stage", 1)[0]
        lo, hi = r["overhead_spread_ms"]
        lines.append(
            f"| {name} | {stage} | {r['step_ms']:.1f} | {r['ceiling_ms']:.1f} | {r['overhead_ms']:.1f} | "
            f"{lo:.1f}..{hi:.1f} | {ratio} | {r['live_mib_after_backward']:.1f} | "
            f"{r['live_mib_after_step']:.1f} | {r['peak_rss_mib']:.0f} ({r['peak_rss_above_start_mib']:+.0f}) | "
            f"{formula:.1f} |"
        )
    if ("ds", 0) in over and ("ddp", 0) in over:
        lines += ["", f"ds stage 0 overhead / DDP overhead: {_ratio(over[('ds', 0)], over[('ddp', 0)])}"]
    if 0 in over_mpi and ("ddp", 0) in over:
        lines += [f"ds mpirun stage 0 overhead / DDP overhead: {_ratio(over_mpi[0], over[('ddp', 0)])}"]
    if 0 in over_mpi_shm and ("ddp", 0) in over:
        lines += [
            f"ds mpirun shm stage 0 overhead / DDP overhead: {_ratio(over_mpi_shm[0], over[('ddp', 0)])}"
        ]
    if 0 in over_gloo and ("ddp", 0) in over:
        lines += [f"ds gloo stage 0 overhead / DDP overhead: {_ratio(over_gloo[0], over[('ddp', 0)])}"]
    return "\n".join(lines)


# ------------------------------------------------------------------ gloo collectives (issue 18)
def collectives_worker(rank: int, world_size: int, steps: int) -> list[dict]:
    """Time the gloo collectives that could carry ZeRO's reduce-scatter and gather, 8 MiB of fp32 each."""
    import torch
    import torch.distributed as dist

    full, part = torch.randn((1 << 21) // world_size * world_size), torch.empty((1 << 21) // world_size)
    chunks = list(full.chunk(world_size))
    candidates = {
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part, full),
        "reduce to each owner": lambda: [dist.reduce(c, dst=r) for r, c in enumerate(chunks)],
        "all_reduce": lambda: dist.all_reduce(full),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, part),
        "broadcast from each owner": lambda: [dist.broadcast(c, src=r) for r, c in enumerate(chunks)],
    }
    results = []
    for name, fn in candidates.items():
        fn()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        dist.barrier()
        results.append({"collective": name, "ms": (time.perf_counter() - start) / steps * 1e3})
    return results


def collectives(world: int, steps: int) -> None:
    from rank_testing import spawn

    rows = spawn(collectives_worker, world, steps, timeout_s=CASE_TIMEOUT_S)[0]
    print(f"| collective (gloo, {world} ranks, 8 MiB fp32) | ms |\n|---|---|")
    print("\n".join(f"| {r['collective']} | {r['ms']:.1f} |" for r in rows))


# ------------------------------------------------------------------ main
def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="2", help="comma-separated world sizes, e.g. 2,4")
    parser.add_argument("--dtypes", default="fp32", help="fp32, bf16 or fp32,bf16")
    parser.add_argument(
        "--model",
        default="gpt13m",
        help="gpt13m (13.3M parameters), lean (gpt13m, short batch), small (4.2M) or tiny",
    )
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case and round")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per case and round")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds over all cases")
    parser.add_argument("--stages", type=_ints, default=list(STAGES), help="ZeRO stages, e.g. 0,1,2")
    parser.add_argument(
        "--impls",
        default="ddp,fsdp2,ds,ds-gloo,ds-mpi,ds-offload,ds-overlap,deepspeed",
        help="which implementations (ds: same-host collectives over shared memory; ds-gloo: over gloo; "
        "ds-mpi: ds under mpirun, collectives over MPI; ds-mpi-shm: the same over shared memory)",
    )
    parser.add_argument("--json", default="bench_training.json", help="where to write every figure")
    parser.add_argument(
        "--zero",
        help="zero_optimization keys for every ds and DeepSpeed case, e.g. '{\"reduce_bucket_size\": 5e7}'",
    )
    parser.add_argument("--collectives", action="store_true", help="only time gloo collectives (8 MiB fp32)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case in this interpreter
    parser.add_argument("--mpirun-case", help=argparse.SUPPRESS)  # internal: one rank of an mpirun case
    args = parser.parse_args()
    if args.case:
        case_worker(json.loads(args.case))
        return
    if args.mpirun_case:
        mpirun_rank_worker(json.loads(args.mpirun_case))
        return
    if args.collectives:
        for world in _ints(args.world):
            collectives(world, max(args.steps, 10))
        return

    command = shlex.join([os.path.relpath(sys.executable)] + sys.argv)
    notes = []
    ds_stages = [s for s in args.stages if s != 3]
    if 3 in args.stages:
        reason = ds_accepts_stage3()
        ds_stages = list(args.stages) if reason is None else ds_stages
        if reason:
            notes.append(f"ds stage 3 skipped: the installed ds-config refuses it ({reason})")
    if "deepspeed" in args.impls.split(",") and not DS_PYTHON.exists():
        args.impls = ",".join(i for i in args.impls.split(",") if i != "deepspeed")
        notes.append(f"DeepSpeed skipped: {DS_PYTHON} does not exist")
    header = [
        f"command: {command}",
        f"started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}",
        f"model {args.model}; {args.steps} timed steps after {args.warmup} warm-up, {args.repeats} rounds",
        *notes,
    ]
    print("\n".join(header), flush=True)

    from _record import provenance  # noqa: PLC0415 (tools/bench is on sys.path from here on)

    report: dict = {**provenance(), "command": command, "notes": notes, "settings": vars(args), "runs": [], "results": []}
    out = Path(args.json)
    for world in _ints(args.world):
        for dtype in args.dtypes.split(","):
            cases = plan_cases(args, ds_stages)
            base = {
                "world": world,
                "dtype": dtype,
                "model": args.model,
                "steps": args.steps,
                "warmup": args.warmup,
                **({"zero": json.loads(args.zero)} if args.zero else {}),
            }
            runs: list[list[dict]] = [[] for _ in cases]
            for round_ in range(args.repeats):
                for case, case_runs in zip(cases, runs):
                    case_runs.append(run_case_subprocess({**base, **case}))
                    print(progress_line(case_runs[-1], {**base, **case}, round_), flush=True)
                    # written after every case: an interrupted run keeps what it measured
                    report["runs"].append({**base, **case, "round": round_, **case_runs[-1]})
                    out.write_text(json.dumps(report, indent=1))
            rows = [{**base, **case, **summarise(r, world, dtype)} for case, r in zip(cases, runs)]
            report["results"] += rows
            print("\n" + table(rows, world, dtype, args.repeats), flush=True)
    report["load_average_end"] = os.getloadavg()[0]
    out.write_text(json.dumps(report, indent=1))
    print(f"\nload average at the end {report['load_average_end']:.1f}; every figure in {args.json}")


if __name__ == "__main__":
    main()

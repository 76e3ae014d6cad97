#!/usr/bin/env python
"""The largest GPT that completes 3 training steps on N ranks: ds stage 3, ds stage 2, DDP and FSDP2.

Every implementation climbs the same ladder of GPT sizes (tools/_bench_cases.py's GPT: fixed width,
heads, vocab, sequence and micro batch; the number of layers grows, ``--layers``), fp32 with Adam and
gradient clipping, the same config for all: ds through ``ds_engine.initialize`` (at stage 3 the model is
built inside ``ds_engine.zero.Init``), DDP and FSDP2 (``fully_shard`` per block and at the root) with
``torch.optim.AdamW``; the model and the wrapping are bench_training's, not a copy. Each rung is a fresh
run of ``--world`` processes (gloo, one thread each) that must complete ``--steps`` steps.

Judged the same way for every implementation: a rung fails when a rank dies out of memory (killed by
SIGKILL, MemoryError, RuntimeError from an allocator) or when the sum of the ranks' RSS passes
``--budget-gib``: a watchdog in this process samples it every 0.2 s (tools/_rank_watchdog.py) and kills
the run, so a failing rung never takes the machine down (there is no swap). The default budget is 22 GiB
minus what everything else holds when the tool starts (printed). An implementation stops climbing at
its first failure (``--bisect``: one more run halfway between its last ok and first failed rung); the
largest rung that completed is its result. Any other error also stops the climb and is shown as an error.

Recorded per rung (printed, and in ``--json``): parameters, ok / fail / error and why, the phase the
ranks had reached (built, wrapped, step k), peak total RSS as sampled, per-step time (slowest rank).

Checking the tool (a few minutes on the shared machine: start-up dominates):

    .venv/bin/python tools/bench_largest_fit.py --world 4 --width 256 --heads 4 --layers 2,4

For the lead, with the machine to itself (after 17:20): width 1600 (GPT-2 XL's), 25 heads, vocab 16000,
seq 128, micro batch 1; 30.7M parameters per layer plus 25.8M of embeddings, so the default ladder of
4, 8, ..., 52 layers is 0.149B, 0.272B, ..., 1.009B (32 layers), ..., 1.624B:

    .venv/bin/python tools/bench_largest_fit.py --world 4 --bisect --json largest_fit.json

Duration, extrapolated from measured rungs at 6 layers = 0.210B, 4 ranks, on the shared machine (load
average ~10, 16:37-16:45 UTC): FSDP2 steps of 60, 45, 33 s, 217 s for the whole rung (start-up,
construction, wrapping, 3 steps), peak total RSS 7.65 GiB; ds stage 3 steps of 40, 44, 14 s, 164 s,
peak total RSS 12.92 GiB. At width 1024, 16 heads, 8 layers = 0.117B (16:50-16:58 UTC, --budget-gib 10):
peak total RSS ds stage 3 8.73 GiB, FSDP2 5.03, ds stage 2 7.27, DDP killed at 10.0. A rung's time grows about linearly with its parameters (the layers dominate
the compute, the construction and Adam): ~1000 s per billion parameters under that load. The default
ladder sums to 11.5B parameters, ~3.3 h for an implementation that climbed all of it; none will: each
stops at its first failure, and at the memory measured above (RSS per parameter roughly constant, not
verified beyond 0.21B) DDP and ds stage 2 stop within the first 2-4 rungs and FSDP2 and ds stage 3 below
~0.9B. Expect 1.5-3 h in all with the machine loaded as it was, perhaps half that with the machine to
itself (not measured). To save time, run the rungs that matter per implementation (each is still judged
the same way), e.g. ``--impls ddp,ds2 --layers 4,8,12,16,20,24`` then ``--impls ds3,fsdp2 --layers
8,12,16,20,24,28,32``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parent / "testing")]  # _bench_* modules and rank_testing
from _rank_watchdog import GIB, log_tail, run_watched, used_by_others_bytes  # noqa: E402
from rank_testing import free_port  # noqa: E402

IMPLS = {  # name -> the case of tools/_bench_cases.py it runs
    "ds3": {"impl": "ds", "stage": 3},
    "ds2": {"impl": "ds", "stage": 2},
    "ddp": {"impl": "ddp", "stage": 0},
    "fsdp2": {"impl": "fsdp2", "stage": 0},
}
DEFAULT_LAYERS = ",".join(str(n) for n in range(4, 53, 4))
MACHINE_GIB = 22.0


# ------------------------------------------------------------------ one rank (runs in its own process)
def rank_main(spec: dict) -> None:
    """Build, wrap and train ``spec["steps"]`` steps; print PHASE lines as it goes and FIT_RESULT at the end."""
    import torch
    import torch.distributed as dist
    from _bench_cases import BUILDERS, ModelDims, batch, build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    d = ModelDims(**spec["dims"])

    def phase(name: str) -> None:
        print(f"PHASE {name}", flush=True)

    model = build_model(spec, d)
    set_checkpointing(model, spec)
    phase("built")
    fwd_bwd, update = BUILDERS[spec["impl"]](model, spec, d)
    phase("wrapped")
    step_s = []
    for i in range(spec["steps"]):
        idx, tgt = batch(d, rank, i)
        dist.barrier()  # each step starts together: its time is the step's, not waiting for a slow rank
        begin = time.perf_counter()
        fwd_bwd(idx, tgt)
        update()
        step_s.append(time.perf_counter() - begin)
        phase(f"step {i + 1}")
    dist.barrier()
    print("FIT_RESULT " + json.dumps({"rank": rank, "step_s": step_s}), flush=True)
    dist.destroy_process_group()


def set_checkpointing(model: Any, spec: dict) -> None:
    """With ``checkpoint_activations``, every block is recomputed in backward, through each
    implementation's own function: ds_engine.checkpointing's for ds (at stage 3 it re-gathers the block's
    weights), torch.utils.checkpoint's (non-reentrant) for the others."""
    if not spec.get("checkpoint_activations"):
        return
    if spec["impl"] == "ds":
        import ds_engine

        model.checkpoint = ds_engine.checkpointing.checkpoint
    else:
        from torch.utils.checkpoint import checkpoint

        model.checkpoint = functools.partial(checkpoint, use_reentrant=False)


# ------------------------------------------------------------------ one rung, watched
def count_params(dims: dict) -> int:
    """Parameters of the GPT at ``dims``, counted on the meta device (nothing is allocated)."""
    import torch
    from _bench_cases import GPT, ModelDims

    with torch.device("meta"):
        return sum(p.numel() for p in GPT(ModelDims(**dims)).parameters())


def _read_rank_lines(logs: Path, world: int) -> tuple[str, list[list[float]]]:
    """The furthest phase every rank reached, and the step times of the ranks that finished."""
    phases, steps = [], []
    for rank in range(world):
        lines = (logs / f"rank{rank}.out").read_text().splitlines()
        phases.append(next((ln[6:] for ln in reversed(lines) if ln.startswith("PHASE ")), "starting"))
        steps += [json.loads(ln[11:])["step_s"] for ln in lines if ln.startswith("FIT_RESULT ")]
    return min(phases, key=_phase_order), steps  # the rank that got least far says where it failed


def _phase_order(phase: str) -> int:
    """starting < built < wrapped < step 1 < step 2 ..."""
    fixed = {"starting": 0, "built": 1, "wrapped": 2}
    return fixed[phase] if phase in fixed else 2 + int(phase.split()[1])


def run_rung(name: str, layers: int, args: argparse.Namespace, budget_bytes: int) -> dict:
    """One fresh ``--world``-process run of implementation ``name`` with ``layers`` layers."""
    dims = {"vocab": args.vocab, "width": args.width, "layers": layers, "heads": args.heads,
            "seq": args.seq, "micro_batch": args.micro_batch}  # fmt: skip
    spec = {**IMPLS[name], "dtype": "fp32", "dims": dims, "steps": args.steps}
    spec["checkpoint_activations"] = args.checkpoint_activations
    if spec["impl"] == "ds":
        spec["zero"] = json.loads(args.zero)
    env = dict(os.environ, WORLD_SIZE=str(args.world), LOCAL_WORLD_SIZE=str(args.world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")  # fmt: skip
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rank", json.dumps(spec)]
    with tempfile.TemporaryDirectory(prefix=f"fit-{name}-{layers}-") as tmp:
        outcome, oom = run_watched([cmd] * args.world, env, Path(tmp), budget_bytes, args.rung_timeout_s)
        phase, steps = _read_rank_lines(Path(tmp), args.world)
        # a rank that failed by itself (not killed by SIGKILL): its traceback, for the lead to read in --json
        tracebacks = {r: log_tail(Path(tmp) / f"rank{r}.err", 2000)
                      for r, code in enumerate(outcome.returncodes) if code not in (0, -9)}  # fmt: skip
    status = "ok" if outcome.ok else ("fail" if oom else "error")
    per_step = [max(s) for s in zip(*steps)] if len(steps) == args.world else []
    return {"impl": name, "layers": layers, "params": count_params(dims), "status": status,
            "reason": outcome.reason, "phase": phase, "peak_total_rss_gib": outcome.peak_total_rss_bytes / GIB,
            "step_s": per_step, "wall_s": outcome.wall_s, "returncodes": outcome.returncodes,
            "tracebacks": tracebacks}  # fmt: skip


def rung_line(r: dict) -> str:
    steps = ", ".join(f"{s:.2f}" for s in r["step_s"]) or "-"
    why = f" ({r['reason']}; reached {r['phase']})" if r["status"] != "ok" else ""
    return (f"{r['impl']:>5} {r['layers']:>3} layers {r['params'] / 1e9:6.3f}B: {r['status']}{why}; "
            f"peak total RSS {r['peak_total_rss_gib']:.2f} GiB; step s [{steps}]; wall {r['wall_s']:.0f} s")  # fmt: skip


def climb(name: str, ladder: list[int], args: argparse.Namespace, budget_bytes: int) -> list[dict]:
    """Run the ladder up to the first rung that does not complete (then bisect once if asked)."""
    rungs: list[dict] = []
    for layers in ladder:
        rungs.append(run_rung(name, layers, args, budget_bytes))
        print(rung_line(rungs[-1]), flush=True)
        if rungs[-1]["status"] != "ok":
            break
    ok = [r["layers"] for r in rungs if r["status"] == "ok"]
    failed = rungs[-1]["layers"] if rungs and rungs[-1]["status"] == "fail" else None
    if args.bisect and ok and failed is not None and failed - ok[-1] > 1:
        rungs.append(run_rung(name, (ok[-1] + failed) // 2, args, budget_bytes))
        print(rung_line(rungs[-1]) + "  (bisect)", flush=True)
    return rungs


def largest(rungs: list[dict]) -> dict | None:
    ok = [r for r in rungs if r["status"] == "ok"]
    return max(ok, key=lambda r: r["layers"]) if ok else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated, from " + ",".join(IMPLS))
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layers", default=DEFAULT_LAYERS, help="the ladder, e.g. 4,8,12 (increasing)")
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--budget-gib", type=float, help=f"default: {MACHINE_GIB} GiB minus what others use")
    parser.add_argument("--bisect", action="store_true", help="one extra run between last ok and first fail")
    parser.add_argument("--rung-timeout-s", type=float, default=3600)
    parser.add_argument("--json", help="write every rung and the result here")
    parser.add_argument(
        "--zero",
        default="{}",
        help="JSON merged into ds's zero_optimization, e.g. the stage-3 working-set keys DeepSpeed's docs "
        "tell users to lower when a model does not fit (defaults: DeepSpeed's, which keep up to 1e9 "
        "parameters gathered and reduce in buckets of 5e8 elements)",
    )
    parser.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="every implementation recomputes each block in backward (ds: ds_engine.checkpointing."
        "checkpoint, which re-gathers stage 3's weights; others: torch.utils.checkpoint)",
    )
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run one rank in this interpreter
    args = parser.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank))
        return
    # SIGTERM (timeout, a killed job) unwinds like Ctrl-C, so the watchdog's finally kills the ranks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{Path(__file__).name}: terminated"))
    impls = args.impls.split(",")
    ladder = [int(x) for x in args.layers.split(",") if x]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown or ladder != sorted(set(ladder)) or not ladder:
        parser.error(f"--impls takes {','.join(IMPLS)} (got {unknown}); --layers an increasing list")
    others = used_by_others_bytes()
    budget = args.budget_gib * GIB if args.budget_gib else MACHINE_GIB * GIB - others
    print(f"command: {shlex.join([os.path.relpath(sys.executable)] + sys.argv)}")
    print(f"memory in use by everything else at start: {others / GIB:.2f} GiB; "
          f"budget for the ranks' total RSS: {budget / GIB:.2f} GiB"
          + ("" if args.budget_gib else f" ({MACHINE_GIB} GiB - that)"))  # fmt: skip
    rungs_dims = {"vocab": args.vocab, "width": args.width, "heads": args.heads, "seq": args.seq,
                  "micro_batch": args.micro_batch}  # fmt: skip
    print("ladder: " + ", ".join(f"{n} layers = {count_params({**rungs_dims, 'layers': n}) / 1e9:.3f}B"
                                 for n in ladder), flush=True)  # fmt: skip
    report: dict = {"settings": vars(args), "budget_gib": budget / GIB, "others_gib": others / GIB,
                    "rungs": [], "largest": {}}  # fmt: skip
    for name in impls:
        rungs = climb(name, ladder, args, int(budget))
        report["rungs"] += rungs
        best = largest(rungs)
        report["largest"][name] = best and {k: best[k] for k in ("layers", "params", "peak_total_rss_gib")}
        if args.json:  # after every implementation: an interrupted search keeps what it found
            Path(args.json).write_text(json.dumps(report, indent=1))
    print(
        f"\n| impl | largest that completed {args.steps} steps | params | peak total RSS GiB | first failure |"
    )
    print("|---|---|---|---|---|")
    for name in impls:
        best = report["largest"][name]
        fails = [r for r in report["rungs"] if r["impl"] == name and r["status"] != "ok"]
        first = f"{fails[0]['layers']} layers: {fails[0]['reason']}" if fails else "none in the ladder"
        size = (
            f"{best['layers']} layers | {best['params'] / 1e9:.3f}B | {best['peak_total_rss_gib']:.2f}"
            if best
            else "none | - | -"
        )
        print(f"| {name} | {size} | {first} |")


if __name__ == "__main__":
    main()

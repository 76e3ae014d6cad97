"""Where a ZeRO-3 step's time goes against ZeRO-2's (and FSDP2's) on one device, in one run: for each case,
the median unprofiled step, then cProfile's Python functions and torch.profiler's ops over the same steps.

    python3 tools/gpu/profile_zero_gpu.py --out $OUT/profile.txt                        # on a GPU (one rank)
    python tools/gpu/profile_zero_gpu.py --device cpu --model tiny --steps 2 --out /tmp/profile.txt   # on CPU

The cases are tools/gpu/gpu_engine_check.py's (same GPT, config and batches; default: stage 2 bf16, stage 3
bf16, FSDP2 bf16). Each takes ``--warmup`` steps, ``--steps`` timed steps (device synchronised around each),
``--steps`` steps under cProfile (the top Python functions by own time and by cumulative time: ds's hooks
and bookkeeping show here), and ``--steps`` steps under torch.profiler with each step's forward, backward
and update marked ``phase/forward``, ``phase/backward``, ``phase/step``. It writes, per case: the phases,
the top ops by self CPU time and (on CUDA) by self device time, with call counts over all profiled steps.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.autograd.profiler_util import EventList
from torch.profiler import ProfilerActivity, profile, record_function

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "bench")]
from _bench_cases import make_model  # noqa: E402
from gpu_engine_check import CASES, MODELS, _batches, _ds, _fsdp2, _sync  # noqa: E402

DEFAULT_CASES = "stage 2 bf16,stage 3 bf16,FSDP2 bf16"


def _steps(fwd_bwd, update, batches, device: torch.device, marked: bool) -> list[float]:
    """One step per batch, synchronised; returns each step's seconds (phases marked when ``marked``)."""
    times = []
    for idx, tgt in batches:
        _sync(device)
        t0 = time.perf_counter()
        loss = fwd_bwd(idx, tgt)  # marks phase/forward and phase/backward itself
        if marked:
            with record_function("phase/step"):
                update()
        else:
            update()
        _sync(device)
        times.append(time.perf_counter() - t0)
        del loss
    return times


def profile_case(name: str, args: argparse.Namespace, device: torch.device) -> str:
    """The report of one case: its median step, cProfile's tables and torch.profiler's tables."""
    extra = CASES[name]
    d = MODELS[args.model]
    gc.collect()
    model = make_model(d)
    fwd_bwd, update, _ = (_fsdp2 if "fsdp2" in extra else _ds)(model, extra, d, device)
    n = args.steps
    batches = _batches(d, args.warmup + 3 * n, device)
    _steps(fwd_bwd, update, batches[: args.warmup], device, marked=False)
    plain = _steps(fwd_bwd, update, batches[args.warmup : args.warmup + n], device, marked=False)

    prof = cProfile.Profile()
    prof.enable()
    _steps(fwd_bwd, update, batches[args.warmup + n : args.warmup + 2 * n], device, marked=False)
    prof.disable()
    py = io.StringIO()
    stats = pstats.Stats(prof, stream=py).strip_dirs()
    stats.sort_stats("tottime").print_stats(args.rows)
    stats.sort_stats("cumulative").print_stats(args.rows)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=False) as tp:
        marked = _steps(fwd_bwd, update, batches[args.warmup + 2 * n :], device, marked=True)
    averages = tp.key_averages()
    phases = EventList([e for e in averages if e.key.startswith("phase/")])
    sort_device = "self_device_time_total"
    parts = [
        f"## {name}: median step {statistics.median(plain) * 1e3:.2f} ms unprofiled "
        f"({statistics.median(marked) * 1e3:.2f} ms under torch.profiler), {n} steps each",
        f"### phases over {n} steps\n" + phases.table(sort_by="cpu_time_total", row_limit=10),
        f"### top ops by self CPU time over {n} steps\n"
        + averages.table(sort_by="self_cpu_time_total", row_limit=args.rows),
    ]
    if device.type == "cuda":
        parts.append(
            f"### top ops by self device time over {n} steps\n"
            + averages.table(sort_by=sort_device, row_limit=args.rows)
        )
    parts.append(f"### cProfile over {n} steps: own time, then cumulative\n" + py.getvalue())
    del fwd_bwd, update, model, tp, averages, phases
    return "\n\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="gpu", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=5, help="steps timed, and again under each profiler")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rows", type=int, default=25, help="rows per table")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated gpu_engine_check case names")
    parser.add_argument("--out", default="profile_zero_gpu.txt")
    args = parser.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    device = torch.device(args.device)
    import ds_launch

    ds_launch.init_distributed()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    head = f"# profile_zero_gpu: model {args.model} on {name}, torch {torch.__version__}"
    reports, failed = [head], 0
    for case in args.cases.split(","):
        try:
            reports.append(profile_case(case, args, device))
        except Exception as exc:  # one failing case is reported, and the others still run
            reports.append(f"## {case}: failed: {type(exc).__name__}: {exc}")
            failed += 1
        print(reports[-1].splitlines()[0], flush=True)
        Path(args.out).write_text("\n\n".join(reports) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

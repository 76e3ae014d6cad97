#!/usr/bin/env python
"""A/B of ds engine steps in one process, interleaved step by step (issue 18's two choices).

Three ds engines on the lean GPT (tools/bench/_bench_cases.py), 2 gloo ranks, fp32, client AdamW, clipping 1.0:
as shipped; with ZeRO's collectives forced onto the native ones (``ds_zero._comm.GATHER_CHOICE`` and
``REDUCE_CHOICE`` emptied around that engine's step: all_gather, one reduce per owner; stage 0 uses
neither, so there the two columns differ by noise only); and with ``AdamW(foreach=True)`` (the kernel torch would pick on CPU, kept because it is
explicit). Interleaving step by step puts the machine's load drift on all three alike, which
separate processes (tools/bench/bench_training.py) cannot do on a shared machine. Median of 12 steps after 2,
each step between barriers, rank 0.

    .venv/bin/python tools/bench/bench_step_ab.py 0,1,2
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parents[1] / "testing")]


def work(rank: int, world: int, stage: int) -> dict[str, float]:
    import _bench_cases as bc
    import ds_engine
    import torch
    import torch.distributed as dist
    from ds_zero import _comm

    d = bc.MODELS["lean"]
    spec = {"impl": "ds", "stage": stage, "dtype": "fp32"}
    shipped = (dict(_comm.GATHER_CHOICE), dict(_comm.REDUCE_CHOICE))
    variants = {
        "shipped": ({}, shipped),
        "native collectives": ({}, ({}, {})),
        "foreach=True": ({"foreach": True}, shipped),
    }
    engines = {}
    for name, (kwargs, _) in variants.items():
        model = bc.make_model(d)
        opt = torch.optim.AdamW(model.parameters(), lr=bc.LR, **kwargs)
        engines[name], *_ = ds_engine.initialize(model=model, optimizer=opt, config=bc.engine_config(spec, d))
    times: dict[str, list[float]] = {k: [] for k in engines}
    try:
        for i in range(14):
            idx, tgt = bc.batch(d, rank, i)
            for name, engine in engines.items():
                _comm.GATHER_CHOICE, _comm.REDUCE_CHOICE = variants[name][1]
                dist.barrier()
                start = time.perf_counter()
                engine.backward(engine(idx, tgt))
                engine.step()
                dist.barrier()
                if i >= 2:
                    times[name].append(time.perf_counter() - start)
    finally:
        _comm.GATHER_CHOICE, _comm.REDUCE_CHOICE = shipped
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    from rank_testing import spawn

    stages = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2").split(",")]
    for stage in stages:
        res = spawn(work, 2, stage, timeout_s=900)[0]
        print(
            f"stage {stage}, step ms (median of 12, rank 0): "
            + json.dumps({k: round(v, 1) for k, v in res.items()})
        )


if __name__ == "__main__":
    main()

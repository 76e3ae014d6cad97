"""Pipeline benchmarks (issue 45): the 1F1B bubble, activation memory per stage beside GPipe, and step time
beside DeepSpeed 0.19.8's pipeline engine. Writes JSON records under docs/benchmarks/.

    python tools/bench/bench_pipeline.py bubble      # idle fraction per stage, 2 and 4 stages, 8 micro-batches
    python tools/bench/bench_pipeline.py bubble --sleep-ms 20   # the same with compute that sleeps (no CPU
                                                     # contention between stage processes on a small machine)
    python tools/bench/bench_pipeline.py memory      # peak saved activations per stage vs micro-batches, 1F1B and GPipe
    python tools/bench/bench_pipeline.py steptime --deepspeed-python $DS_DEEPSPEED_PYTHON [--runs 3]

bubble/memory run real gloo ranks (rank_testing.spawn) over ds_pipe's runner with plain SGD hooks: stage
``s`` of ``p`` idles for ``wall - busy`` of a batch, busy being its ForwardPass and BackwardPass time; the 1F1B
ideal is ``(p-1)/(m+p-1)``. Memory is the peak of the bytes autograd holds for backward (saved-tensor hooks),
per stage. steptime runs integration/scripts/pipe/gpt_neox_pipe.py (2 ranks, 2 stages) under ds's and
DeepSpeed's ``deepspeed`` command alternately and compares the median train_batch time of steps 3 and on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "testing"))
OUT = ROOT / "docs" / "benchmarks"
DIM, ROWS, LAYERS = 768, 128, 8


def _dim(sleep_ms: float) -> int:
    """With sleeping compute the real matmuls shrink, so that the sleep is the compute."""
    return 32 if sleep_ms else DIM


def _model_layers(sleep_ms: float = 0.0) -> list:
    import torch
    from ds_pipe import LayerSpec

    class Sleep(torch.autograd.Function):
        """Compute time without CPU use: forward takes sleep_ms, backward twice that."""

        @staticmethod
        def forward(ctx, x):
            time.sleep(sleep_ms / 1000)
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            time.sleep(2 * sleep_ms / 1000)
            return g

    class Dense(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(_dim(sleep_ms), _dim(sleep_ms))

        def forward(self, x):
            y = torch.tanh(self.fc(x))
            return Sleep.apply(y) if sleep_ms else y

    globals()["Dense"] = Dense
    return [LayerSpec(Dense) for _ in range(LAYERS)]


class _Saved:
    """Counts the bytes autograd keeps for backward while the object lives (activations: the weights it
    also saves are not counted)."""

    live = peak = 0
    weights: set[int] = set()

    def __init__(self, t: Any) -> None:
        self.t = t
        self.n = 0 if t.untyped_storage().data_ptr() in _Saved.weights else t.untyped_storage().nbytes()
        _Saved.live += self.n
        _Saved.peak = max(_Saved.peak, _Saved.live)

    def __del__(self) -> None:
        _Saved.live -= self.n


def _gpipe(micro_batches: int, stages: int, stage_id: int) -> Any:
    """GPipe: every forward, then every backward (what 1F1B improves on), as a ds_pipe schedule."""
    from ds_pipe import schedule as S

    class GPipe(S.PipeSchedule):
        def steps(self):
            first, last = stage_id == 0, stage_id == stages - 1
            for mb in range(micro_batches):
                yield [
                    *([S.RecvActivation(mb)] if not first else []),
                    *([S.LoadMicroBatch(mb)] if first or last else []),
                    S.ForwardPass(mb),
                    *([S.SendActivation(mb)] if not last else []),
                ]
            for mb in range(micro_batches):
                yield [
                    *([S.RecvGrad(mb)] if not last else []),
                    S.BackwardPass(mb),
                    *([S.SendGrad(mb)] if not first else []),
                ]
            yield [S.ReduceTiedGrads(), S.ReduceGrads(), S.OptimizerStep()]

    return GPipe(micro_batches, stages, stage_id)


def _stage_run(
    rank: int, world: int, micro_batches: int, schedule: str, repeats: int, sleep_ms: float = 0.0
) -> dict:
    import torch
    import torch.distributed as dist
    from ds_pipe import PipelineGrid, PipelineModule, PipelineRunner

    sys.path.insert(0, str(ROOT / "packages" / "ds-pipe" / "tests"))
    from _workers import SGDHooks

    torch.manual_seed(0)
    module = PipelineModule(
        _model_layers(sleep_ms),
        num_stages=world,
        loss_fn=lambda o, y: (o - y).pow(2).mean(),
        partition_method="uniform",
    )
    grid = PipelineGrid(module.topology(), rank, pipe_group=dist.group.WORLD, data_group=None)
    module.attach_groups(grid, {})
    runner = PipelineRunner(module, grid, torch.device("cpu"))
    _Saved.weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    hooks = SGDHooks(module, micro_batches, lr=1e-4)
    x = torch.randn(ROWS, _dim(sleep_ms))
    data = [(x, x)] * micro_batches
    idle, walls, peaks = [], [], []
    for i in range(repeats + 1):  # the first batch warms up
        runner.trace = []
        _Saved.live = _Saved.peak = 0
        dist.barrier()
        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(_Saved, lambda s: s.t):
            if schedule == "1f1b":
                runner.train_batch(iter(data), micro_batches, hooks)
            else:  # the runner's own loop, GPipe's instructions
                runner._start(iter(data), micro_batches, hooks, train=True)
                runner._run(_gpipe(micro_batches, world, rank))
        wall = time.perf_counter() - t0
        busy = sum(e - s for name, s, e in runner.trace if name in ("ForwardPass", "BackwardPass"))
        if i:
            idle.append((wall - busy) / wall)
            walls.append(wall)
            peaks.append(_Saved.peak)
    return {
        "idle": statistics.median(idle),
        "idle_all": idle,
        "wall_s": statistics.median(walls),
        "peak_saved_bytes": max(peaks),
    }


def _env() -> dict:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "commit": commit,
        "torch": torch.__version__,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def bubble(repeats: int, sleep_ms: float) -> dict:
    from rank_testing import spawn

    rows = []
    for p in (2, 4):
        m = 8
        per_stage = spawn(_stage_run, p, m, "1f1b", repeats, sleep_ms, timeout_s=900)
        ideal = (p - 1) / (m + p - 1)
        rows.append(
            {
                "stages": p,
                "micro_batches": m,
                "ideal": ideal,
                "idle_per_stage": [r["idle"] for r in per_stage],
                "idle_runs": [r["idle_all"] for r in per_stage],
                "wall_s": per_stage[0]["wall_s"],
            }
        )
        print(f"p={p} m={m}: idle per stage {[round(r['idle'], 3) for r in per_stage]}, ideal {ideal:.3f}")
    return {"rows": rows}


def memory(repeats: int) -> dict:
    from rank_testing import spawn

    rows = []
    for sched in ("1f1b", "gpipe"):
        for m in (2, 4, 8):
            per_stage = spawn(_stage_run, 2, m, sched, repeats, timeout_s=900)
            rows.append(
                {
                    "schedule": sched,
                    "stages": 2,
                    "micro_batches": m,
                    "peak_saved_MiB": [r["peak_saved_bytes"] / 2**20 for r in per_stage],
                }
            )
            print(
                f"{sched} m={m}: peak saved activations per stage (MiB) {[round(r['peak_saved_bytes'] / 2**20, 2) for r in per_stage]}"
            )
    return {"rows": rows}


def steptime(deepspeed_python: str, runs: int, steps: int) -> dict:
    script = ROOT / "integration" / "scripts" / "pipe" / "gpt_neox_pipe.py"
    fixture = json.loads(
        (ROOT / "integration" / "fixtures" / "deepspeed_pipe" / "neox_2stages_fp32.json").read_text()
    )
    results: dict[str, list[float]] = {"ds": [], "deepspeed": []}
    ds_env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref_env = {k: v for k, v in ds_env.items() if k != "PYTHONPATH"} | {"DS_ACCELERATOR": "cpu"}
    launchers = {
        "ds": ([sys.executable, "-m", "deepspeed.launcher.runner"], ds_env),
        "deepspeed": ([str(Path(deepspeed_python).parent / "deepspeed")], ref_env),
    }
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "cfg.json"
        cfg.write_text(json.dumps(fixture["config"]))
        for run in range(runs):
            for name in ("ds", "deepspeed") if run % 2 == 0 else ("deepspeed", "ds"):
                out = Path(tmp) / f"{name}{run}.json"
                cmd, env = launchers[name]
                args = [
                    "--num_gpus",
                    "2",
                    str(script),
                    "--stages",
                    "2",
                    "--steps",
                    str(steps),
                    "--out",
                    str(out),
                    "--deepspeed_config",
                    str(cfg),
                ]
                subprocess.run([*cmd, *args], env=env, cwd=tmp, check=True, capture_output=True)
                times = json.loads(out.read_text())["step_times"][2:]
                results[name].append(statistics.median(times))
                print(f"{name} run {run}: median step {results[name][-1] * 1e3:.1f} ms")
    ds_med, ref_med = statistics.median(results["ds"]), statistics.median(results["deepspeed"])
    return {
        "median_step_s": {"ds": ds_med, "deepspeed": ref_med},
        "runs": results,
        "ratio_ds_over_deepspeed": ds_med / ref_med,
        "steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["bubble", "memory", "steptime"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sleep-ms",
        type=float,
        default=0.0,
        help="bubble: each layer's forward also sleeps this long (backward twice)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--deepspeed-python",
        default=os.environ.get("DS_DEEPSPEED_PYTHON"),
        help="a python with deepspeed==0.19.8 installed (default: $DS_DEEPSPEED_PYTHON)",
    )
    args = parser.parse_args()
    before = _env()
    if args.what == "bubble":
        body = bubble(args.repeats, args.sleep_ms)
    elif args.what == "memory":
        body = memory(args.repeats)
    else:
        body = steptime(args.deepspeed_python, args.runs, args.steps)
    record = {
        "command": "python tools/bench/bench_pipeline.py " + " ".join(sys.argv[1:]),
        **before,
        "loadavg_after": Path("/proc/loadavg").read_text().split()[:3],
        **body,
    }
    OUT.mkdir(exist_ok=True)
    path = OUT / f"pipeline-{args.what}{'-sleep' if args.sleep_ms else ''}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

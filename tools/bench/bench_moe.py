"""Mixture of experts: ds against DeepSpeed 0.19.8 on the same DeepSpeed-MoE script, side by side, and
ds's counted collectives.

1. Step time: integration/scripts/moe/moe_train.py (one case, ``--steps N``) under ds's ``deepspeed`` and
   DeepSpeed's, alternating, ``--runs`` times each; per run the median of rank 0's step times (step 0
   left out); reported: the median of the runs and their spread, and the losses of both (equal).
2. All-to-all bytes per step of one MoE layer at ``ep`` ranks, measured (``ds_moe.stats``) against the
   formula 4 exchanges (dispatch, combine; forward, backward) x experts x capacity x width x 4 bytes.
3. ZeRO-3 gathers per leaf module: the fetches of a forward and of a backward of a two-block MoE model at
   2 ranks with skewed routing (ds-zero's test model), with the blocks as leaves.

Writes docs/benchmarks/moe.json (command, commit, versions, load, figures). Usage:
  python tools/bench/bench_moe.py --deepspeed-python $DS_DEEPSPEED_PYTHON [--runs 3 --steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "integration" / "scripts" / "moe" / "moe_train.py"
OUT = ROOT / "docs" / "benchmarks" / "moe.json"


def run_script(launcher: list[str], env: dict, world: int, args: list[str]) -> list[dict]:
    cmd = [*launcher, "--num_gpus", str(world), str(SCRIPT), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        )
    return [
        json.loads(line[line.find('{"case"') :]) for line in proc.stdout.splitlines() if '{"case"' in line
    ]


def step_times(args: argparse.Namespace) -> dict:
    ours_exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    theirs_exe = str(Path(args.deepspeed_python).parent / "deepspeed")
    base = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    theirs_env = {k: v for k, v in base.items() if k != "PYTHONPATH"}
    script_args = ["--ep", str(args.ep), "--k", str(args.k), "--drop", "yes", "--steps", str(args.steps)]
    runs: dict[str, list[float]] = {"ds": [], "deepspeed": []}
    losses: dict[str, list] = {}
    loads = []
    for i in range(args.runs):
        order = [("ds", [ours_exe], base), ("deepspeed", [theirs_exe], theirs_env)]
        for name, exe, env in order if i % 2 == 0 else order[::-1]:
            loads.append(os.getloadavg()[0])
            records = run_script(exe, env, args.world, script_args)
            runs[name].append(statistics.median(r["seconds"] for r in records[1:]))
            losses[name] = [r["loss"][0] for r in records]
    med = {k: statistics.median(v) for k, v in runs.items()}
    return {
        "script_args": script_args,
        "world": args.world,
        "per_run_median_step_s": runs,
        "median_step_s": med,
        "ratio_ds_over_deepspeed": med["ds"] / med["deepspeed"],
        "losses_rank0": losses,
        "losses_equal": losses["ds"] == losses["deepspeed"],
        "load_during": [min(loads), max(loads)],
    }


def _a2a(rank: int, world: int, ep: int) -> dict:
    import ds_moe
    import torch
    from torch import nn

    ep_group = torch.distributed.new_group(list(range(world)))
    torch.manual_seed(0)
    layer = ds_moe.MoE(64, nn.Linear(64, 64), num_experts=2 * ep, ep_size=ep, k=2, min_capacity=0)
    layer.set_process_groups(ep_group)
    x = torch.randn(256, 64, requires_grad=True)
    before = dict(ds_moe.stats)
    out, l_aux, _ = layer(x)
    (out.sum() + l_aux).backward()
    capacity = int(torch.ceil(torch.tensor(256 / (2 * ep) * 2.0)).item())
    return {
        "measured_bytes": ds_moe.stats["all_to_all_bytes"] - before["all_to_all_bytes"],
        "formula_bytes": 4 * (2 * ep) * capacity * 64 * 4,
        "calls": ds_moe.stats["all_to_all_calls"] - before["all_to_all_calls"],
    }


def _leaf(rank: int, world: int) -> dict:
    sys.path.insert(0, str(ROOT / "packages" / "ds-zero" / "tests"))
    import _moe_workers as w

    r = w.train_zero3(rank, world, 2, "class")
    return {"fetches_forward_backward": r["fetches"][-1]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--deepspeed-python", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--skip-time", action="store_true")
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "testing"))
    from rank_testing import spawn

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    record = {
        "command": " ".join(["python", "tools/bench/bench_moe.py", *sys.argv[1:]]),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "date": started,
        "load_at_start": os.getloadavg(),
        "all_to_all": spawn(_a2a, 2, 2)[0],
        "leaf_gathers": spawn(_leaf, 2)[0],
    }
    if not args.skip_time:
        record["step_time"] = step_times(args)
    import torch

    record["versions"] = {"torch": torch.__version__, "python": sys.version.split()[0]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

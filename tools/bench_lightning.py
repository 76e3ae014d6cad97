"""Per-step time under Lightning: ds's ``deepspeed`` against DeepSpeed 0.19.8, with Lightning's DDP as baseline.

    nice -n 10 python tools/bench_lightning.py --ds-python /tmp/fw-venv/bin/python \\
        --deepspeed-python /work/refenv/bin/python [--stages 0 2 3] [--steps 40] [--width 512] [--repeats 2]

Runs integration/frameworks/lightning_script.py (2 ranks, CPU, Lightning's own launcher) in three setups
in one run, interleaved per repeat: ds (``--ds-python`` with this checkout's packages first on PYTHONPATH),
DeepSpeed (``--deepspeed-python``, an environment with the real deepspeed, ``DS_ACCELERATOR=cpu``, nothing
of ds on the path) and Lightning's ``strategy="ddp"`` in the DeepSpeed environment (no engine: the
baseline). A step's time is rank 0's wall time of one training batch (forward, backward, optimizer step),
the median over the steps after the first ``--warmup``, then the best over repeats. Engine overhead =
step time - DDP's step time. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "integration" / "frameworks" / "lightning_script.py"


def ds_path() -> str:
    return os.pathsep.join(str(p) for p in sorted((ROOT / "packages").glob("*/src")))


def run(python: str, args: list[str], ds: bool, warmup: int) -> float:
    env = dict(os.environ, PYTHONWARNINGS="ignore", DS_ACCELERATOR="cpu", PYTHONPATH=ds_path() if ds else "")
    proc = subprocess.run(
        [python, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"{python} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])["step_seconds"][warmup:]
    return statistics.median(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ds-python", default=sys.executable)
    p.add_argument("--deepspeed-python", required=True)
    p.add_argument("--stages", type=int, nargs="+", default=[0, 2, 3])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    opts = p.parse_args()
    base = ["--devices", "2", "--steps", str(opts.steps), "--width", str(opts.width)]
    best: dict[str, float] = {}
    for _ in range(opts.repeats):
        setups = {"ddp": (opts.deepspeed_python, [*base, "--ddp"], False)}
        for stage in opts.stages:
            setups[f"deepspeed{stage}"] = (opts.deepspeed_python, [*base, "--stage", str(stage)], False)
            setups[f"ds{stage}"] = (opts.ds_python, [*base, "--stage", str(stage)], True)
        for name, (python, args, ds) in setups.items():
            t = run(python, args, ds, opts.warmup)
            best[name] = min(best.get(name, t), t)
            print(f"{name}: {t * 1e3:.2f} ms/step", file=sys.stderr, flush=True)
    ddp = best["ddp"]
    print(
        f"2 ranks, CPU, MLP width {opts.width}, fp32, AdamW; Lightning DDP baseline {ddp * 1e3:.2f} ms/step\n"
    )
    print("| ZeRO stage | DeepSpeed 0.19.8 ms/step | ds ms/step | DeepSpeed overhead ms | ds overhead ms |")
    print("|---|---|---|---|---|")
    for stage in opts.stages:
        dsp, ours = best[f"deepspeed{stage}"], best[f"ds{stage}"]
        print(
            f"| {stage} | {dsp * 1e3:.2f} | {ours * 1e3:.2f} | {(dsp - ddp) * 1e3:.2f} | {(ours - ddp) * 1e3:.2f} |"
        )


if __name__ == "__main__":
    main()

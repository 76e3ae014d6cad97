"""AutoTP training, ds against DeepSpeed 0.19.8 side by side in one run: bytes per rank and step time.

    python tools/bench/bench_autotp.py --ds-python <a python with the packages installed> \\
        --deepspeed-python $DS_DEEPSPEED_PYTHON --rounds 3 --json docs/benchmarks/tensor-parallel-autotp.json

Runs integration/frameworks/autotp_script.py (a Llama from its config, hidden --width, fp32, ZeRO 0 so that
the torch optimizer's state is per parameter) at tp 1 (1 rank) and tp 2 (2 ranks) under each implementation,
the four runs alternating, ``--rounds`` times. Per run, rank 0 reports the bytes of the split layers'
parameters (q/k/v/o, gate/up/down) and of their optimizer state, and each step's time; the figure per
configuration is the median over rounds of the median step time (the first step left out), with the spread
(min-max over rounds). The record holds the command, commit, versions and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "integration" / "frameworks"))
from launch import run_script  # noqa: E402


def _version(py: str) -> str:
    code = "import deepspeed, torch, transformers; print(deepspeed.__version__, torch.__version__, transformers.__version__)"
    return subprocess.run([py, "-c", code], capture_output=True, text=True, env=_env(py)).stdout.strip()


def _env(py: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "DS_ACCELERATOR": "cpu"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ds-python", required=True, help="a python where `import deepspeed` is ds's")
    p.add_argument("--deepspeed-python", required=True, help="a python with deepspeed==0.19.8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", default="")
    opts = p.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    impls = {"ds": opts.ds_python, "deepspeed": opts.deepspeed_python}
    common = ["--zero", "0", "--width", str(opts.width), "--layers", str(opts.layers), "--seq", str(opts.seq)]
    common += ["--steps", str(opts.steps), "--report"]
    runs: dict[str, list[dict]] = {}
    for _ in range(opts.rounds):
        for tp in (1, 2):
            for name, py in impls.items():
                recs = run_script(py, "autotp_script.py", "--tp", str(tp), *common, nproc=tp, env=_env(py))
                report = [r for r in recs if "step_seconds" in r][-1]
                runs.setdefault(f"{name} tp{tp}", []).append(report)
                print(
                    name,
                    tp,
                    report["split_layer_param_bytes"],
                    statistics.median(report["step_seconds"][1:]),
                    flush=True,
                )
    rows = {}
    for key, reports in runs.items():
        medians = [statistics.median(r["step_seconds"][1:]) for r in reports]
        rows[key] = {
            "split_layer_param_bytes": reports[0]["split_layer_param_bytes"],
            "split_layer_optimizer_bytes": reports[0]["split_layer_optimizer_bytes"],
            "step_s_median": statistics.median(medians),
            "step_s_spread": [min(medians), max(medians)],
        }
    for impl in impls:
        one, two = rows[f"{impl} tp1"], rows[f"{impl} tp2"]
        rows[f"{impl} tp2/tp1 bytes"] = (
            two["split_layer_param_bytes"] + two["split_layer_optimizer_bytes"]
        ) / (one["split_layer_param_bytes"] + one["split_layer_optimizer_bytes"])
    for tp in (1, 2):
        rows[f"tp{tp} ds/deepspeed step time"] = (
            rows[f"ds tp{tp}"]["step_s_median"] / rows[f"deepspeed tp{tp}"]["step_s_median"]
        )
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "date": datetime.now(timezone.utc).isoformat(timespec="minutes"),
        "versions": {name: _version(py) for name, py in impls.items()},
        "load_before": load_before,
        "load_after": Path("/proc/loadavg").read_text().split()[:3],
        "rows": rows,
        "runs": runs,
    }
    print(json.dumps(rows, indent=1))
    if opts.json:
        Path(opts.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

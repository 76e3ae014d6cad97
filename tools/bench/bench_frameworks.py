"""Engine overhead per step under Hugging Face Trainer, Accelerate and Lightning: ds's ``deepspeed`` against
DeepSpeed 0.19.8 in the same run, each framework's own DDP as the no-engine baseline.

    nice -n 10 python tools/bench/bench_frameworks.py --ds-python /tmp/fw-venv/bin/python \\
        --deepspeed-python $DS_DEEPSPEED_FW_PYTHON [--frameworks trainer accelerate lightning] \\
        [--stages 0 2 3] [--steps 40] [--warmup 5] [--repeats 2] [--size trainer=256x4] [--json OUT.json]

Each framework's unmodified test script (integration/frameworks/*_script.py, 2 ranks, CPU, gloo, one thread
per rank) runs in three setups, interleaved per repeat so that a change in the machine's load hits all of
them alike:

- **ds**: ``--ds-python`` with this checkout's packages/*/src first on PYTHONPATH (the environment must
  have the ``deepspeed`` distribution installed, which the frameworks look up by its metadata);
- **DeepSpeed**: ``--deepspeed-python``, an environment with the real deepspeed 0.19.8,
  ``DS_ACCELERATOR=cpu``, nothing of ds on the path;
- **DDP**: the framework's own DDP (the script's ``--ddp``: no engine) in the DeepSpeed environment;
- **ds-baseline** (with ``--ds-baseline ROOT``): ds from another checkout ``ROOT`` (e.g. ``git worktree add
  ROOT <commit>``), in ``--ds-python``: a before/after of a change to ds, interleaved with the rest, and
  reported in a second table.

Trainer and Accelerate run under torchrun, Lightning under its own launcher. A step's time is rank 0's
wall time of one training step (forward, backward, optimizer or engine step; how each script takes it is in
its docstring), the median over the steps after the first ``--warmup``, then the best over repeats.
Overhead = step time - the same framework's DDP step time. The setups must train alike: the first
``--check-steps`` losses of ds and of DeepSpeed (and, for reference, of DDP) are compared with DeepSpeed's,
and any over ``--loss-tol`` (relative) is flagged in the table and listed under it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "integration" / "frameworks"


@dataclass(frozen=True)
class Framework:
    title: str
    script: str
    torchrun: bool  # else the script launches its ranks itself (Lightning)
    width: int  # the benchmark's model size (the scripts' defaults are the tests' tiny models)
    layers: int | None  # None: the script has no --layers


FRAMEWORKS = {
    "trainer": Framework("HF Trainer", "trainer_script.py", True, 256, 4),  # GPT-2, ~3.2M parameters
    "accelerate": Framework("Accelerate", "accelerate_script.py", True, 1024, 4),  # MLP, ~3.2M parameters
    "lightning": Framework("Lightning", "lightning_script.py", False, 1024, None),  # MLP, ~1.1M parameters
}
SETUPS = ("ddp", "deepspeed", "ds")
Key = tuple[str, str, int | None]  # (framework, setup, ZeRO stage; None for DDP)


def ds_path(root: Path = ROOT) -> str:
    return os.pathsep.join(str(p) for p in sorted((root / "packages").glob("*/src")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(fw: Framework, python: str, args: list[str], out: str) -> list[str]:
    script = str(SCRIPTS / fw.script)
    if fw.torchrun:
        launcher = ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port())]
        return [python, *launcher, script, *args, "--out", out]
    return [python, script, *args, "--devices", "2"]


def script_args(setup: str, stage: int | None, steps: int, width: int, layers: int | None) -> list[str]:
    args = ["--steps", str(steps), "--width", str(width)]
    if layers is not None:
        args += ["--layers", str(layers)]
    return [*args, "--ddp"] if setup == "ddp" else [*args, "--stage", str(stage)]


def records(stdout: str) -> list[dict]:
    """The JSON objects rank 0 printed, one per line (a line may carry a launcher's prefix)."""
    found = []
    for line in stdout.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            value = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def parse(found: list[dict]) -> tuple[list[float], list[float]]:
    """(step seconds, step losses) from a script's records: Lightning prints both in its one final record,
    Trainer and Accelerate a {"step", "loss"} record per step and a final {"step_seconds"}."""
    seconds = [r["step_seconds"] for r in found if "step_seconds" in r]
    if not seconds:
        raise ValueError("the script printed no step_seconds")
    summary = [r["losses"] for r in found if "losses" in r]
    losses = summary[-1] if summary else [r["loss"] for r in found if "step" in r and "loss" in r]
    return seconds[-1], losses


def step_time(seconds: list[float], warmup: int) -> float:
    """Median over the steps after the first ``warmup``."""
    timed = seconds[warmup:]
    if not timed:
        raise ValueError(f"{len(seconds)} steps leave none after a warmup of {warmup}")
    return statistics.median(timed)


def max_rel_diff(ours: list[float], theirs: list[float], steps: int) -> float:
    """Largest relative difference over the first ``steps`` losses; inf if either run has fewer."""
    if min(len(ours), len(theirs)) < steps:
        return float("inf")
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(ours[:steps], theirs[:steps]))


def launch(fw: Framework, python: str, args: list[str], ds: Path | None) -> tuple[list[float], list[float]]:
    """Run one setup; ``ds``: the checkout whose packages go first on the path (None: nothing of ds)."""
    env = dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        DS_ACCELERATOR="cpu",
        PYTHONPATH=ds_path(ds) if ds is not None else "",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as out:
        cmd = command(fw, python, args, out)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=out)
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return parse(records(proc.stdout))


@dataclass
class Row:
    framework: str
    stage: int
    ddp: float  # seconds per step
    deepspeed: float
    ds: float
    ds_loss_diff: float  # ds against DeepSpeed, max relative difference over the checked steps
    ddp_loss_diff: float  # DDP against DeepSpeed, for reference


def rows(
    best: dict[Key, float],
    losses: dict[Key, list[float]],
    names: list[str],
    stages: list[int],
    check_steps: int,
) -> list[Row]:
    out = []
    for name in names:
        for stage in stages:
            theirs = losses[(name, "deepspeed", stage)]
            out.append(
                Row(
                    framework=FRAMEWORKS[name].title,
                    stage=stage,
                    ddp=best[(name, "ddp", None)],
                    deepspeed=best[(name, "deepspeed", stage)],
                    ds=best[(name, "ds", stage)],
                    ds_loss_diff=max_rel_diff(losses[(name, "ds", stage)], theirs, check_steps),
                    ddp_loss_diff=max_rel_diff(losses[(name, "ddp", None)], theirs, check_steps),
                )
            )
    return out


def table(table_rows: list[Row], check_steps: int, loss_tol: float) -> str:
    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.2f}"

    def diff(d: float) -> str:
        return f"{d:.1e}" + (" **differs**" if not d <= loss_tol else "")

    lines = [
        "| Framework | ZeRO stage | DDP ms/step | DeepSpeed 0.19.8 ms/step | DeepSpeed overhead ms "
        f"| ds ms/step | ds overhead ms | loss ds vs DeepSpeed (first {check_steps}) "
        f"| loss DDP vs DeepSpeed (first {check_steps}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table_rows:
        lines.append(
            f"| {r.framework} | {r.stage} | {ms(r.ddp)} | {ms(r.deepspeed)} | {ms(r.deepspeed - r.ddp)} "
            f"| {ms(r.ds)} | {ms(r.ds - r.ddp)} | {diff(r.ds_loss_diff)} | {diff(r.ddp_loss_diff)} |"
        )
    notes = []
    for r in table_rows:
        for what, d in (("ds", r.ds_loss_diff), ("the DDP baseline", r.ddp_loss_diff)):
            if not d <= loss_tol:
                notes.append(
                    f"{what} and DeepSpeed train differently: {r.framework} ZeRO {r.stage}, losses of the "
                    f"first {check_steps} steps differ by up to {d:.1e} relative (tolerance {loss_tol:.0e})"
                )
    return "\n".join([*lines, *([""] + notes if notes else [])])


def sizes(overrides: list[str]) -> dict[str, tuple[int, int | None]]:
    """Each framework's (width, layers), with ``NAME=WIDTH`` or ``NAME=WIDTHxLAYERS`` overrides."""
    out = {name: (fw.width, fw.layers) for name, fw in FRAMEWORKS.items()}
    for item in overrides:
        name, _, size = item.partition("=")
        if name not in FRAMEWORKS or not size:
            raise SystemExit(
                f"--size {item}: expected NAME=WIDTH[xLAYERS], NAME one of {', '.join(FRAMEWORKS)}"
            )
        width, _, layers = size.partition("x")
        if layers and FRAMEWORKS[name].layers is None:
            raise SystemExit(f"--size {item}: {name}'s script has no --layers")
        out[name] = (int(width), int(layers) if layers else out[name][1])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ds-python", default=sys.executable)
    p.add_argument("--deepspeed-python", required=True)
    p.add_argument("--frameworks", nargs="+", choices=list(FRAMEWORKS), default=list(FRAMEWORKS))
    p.add_argument("--stages", type=int, nargs="+", default=[0, 2, 3])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--size", action="append", default=[], help="NAME=WIDTH[xLAYERS], e.g. trainer=256x4")
    p.add_argument("--check-steps", type=int, default=5, help="losses compared over this many first steps")
    p.add_argument("--loss-tol", type=float, default=1e-3, help="relative tolerance of the loss comparison")
    p.add_argument("--json", default=None, help="also write every measurement here")
    p.add_argument("--ds-baseline", default=None, help="a second ds checkout, measured beside this one")
    opts = p.parse_args()
    if opts.steps <= opts.warmup:
        raise SystemExit("--steps must exceed --warmup")
    size = sizes(opts.size)
    times: dict[Key, list[float]] = {}
    losses: dict[Key, list[float]] = {}
    for repeat in range(opts.repeats):
        for name in opts.frameworks:
            fw = FRAMEWORKS[name]
            setups: list[tuple[str, int | None]] = [("ddp", None)]
            for stage in opts.stages:
                setups += [("deepspeed", stage), ("ds", stage)]
                setups += [("ds-baseline", stage)] if opts.ds_baseline else []
            for setup, stage in setups:
                root = {"ds": ROOT, "ds-baseline": Path(opts.ds_baseline or ".")}.get(setup)
                python = opts.ds_python if root is not None else opts.deepspeed_python
                args = script_args(setup, stage, opts.steps, *size[name])
                seconds, step_losses = launch(fw, python, args, ds=root)
                key = (name, setup, stage)
                times.setdefault(key, []).append(step_time(seconds, opts.warmup))
                losses.setdefault(key, step_losses)
                stage_note = "" if stage is None else f" ZeRO {stage}"
                print(
                    f"repeat {repeat + 1}: {fw.title} {setup}{stage_note}: {times[key][-1] * 1e3:.2f} ms/step",
                    file=sys.stderr,
                    flush=True,
                )
    best = {key: min(ts) for key, ts in times.items()}
    described = ", ".join(
        f"{FRAMEWORKS[n].title} width {size[n][0]}" + (f" x {size[n][1]} layers" if size[n][1] else "")
        for n in opts.frameworks
    )
    print(
        f"2 ranks, CPU (gloo, 1 thread per rank), fp32, AdamW; {described}; {opts.steps} steps, median after "
        f"{opts.warmup}, best of {opts.repeats}\n"
    )
    print(
        table(
            rows(best, losses, opts.frameworks, opts.stages, opts.check_steps),
            opts.check_steps,
            opts.loss_tol,
        )
    )
    if opts.ds_baseline:
        print(
            f"\nds against ds at {opts.ds_baseline} (ms/step; loss: max relative difference, first "
            f"{opts.check_steps} steps)\n"
        )
        print(
            "| Framework | ZeRO stage | ds baseline | ds | ds / baseline | loss ds vs baseline |\n|---|---|---|---|---|---|"
        )
        for name in opts.frameworks:
            for stage in opts.stages:
                a, b = best[(name, "ds-baseline", stage)], best[(name, "ds", stage)]
                d = max_rel_diff(
                    losses[(name, "ds", stage)], losses[(name, "ds-baseline", stage)], opts.check_steps
                )
                print(
                    f"| {FRAMEWORKS[name].title} | {stage} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.2f} | {d:.1e} |"
                )
    if opts.json:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from _record import load_average, provenance  # noqa: PLC0415

        record = {
            **provenance(),
            "load_average_end": load_average(),
            "options": vars(opts),
            "sizes": size,
            "step_seconds": [{"key": list(k), "per_repeat": v} for k, v in times.items()],
            "losses": [{"key": list(k), "losses": v} for k, v in losses.items()],
        }
        Path(opts.json).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

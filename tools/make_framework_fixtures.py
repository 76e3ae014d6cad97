"""Record DeepSpeed 0.19.8's step losses (and saved weights) under each framework, for integration/frameworks.

Command (from the repository root; the real DeepSpeed, no ds on the path):
  env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv-fw/bin/python tools/make_framework_fixtures.py [framework ...]

Runs every case of CASES below with the real ``deepspeed==0.19.8`` (the environment's python, with the
framework releases pinned in noxfile.py's FRAMEWORKS) and writes
``integration/frameworks/fixtures/<framework>.json``: per case, the step losses, and the per-tensor sums
of the weights the script saves (for the cases that pass ``--save``).
To add a framework or a case, add rows to CASES: the tests read the fixture by the same case names.

The nvme cases (the Trainer's and Accelerate's ``zero3_nvme``, ``lightning_stage_3_offload_nvme``) also record ``deepspeed_swap_files``: every
file DeepSpeed left under the case's nvme_path with its size and non-zero bytes. Recorded 2026-12-06: none.
DeepSpeed 0.19.8 swaps a parameter partition or an optimizer tensor to disk only when it holds at least
``max(1 MiB, aio.block_size)`` bytes (``swap_tensor/utils.py`` MIN_AIO_BYTES, ``swappable_tensor``); every
partition of these small models is below that, so DeepSpeed kept them all in CPU memory and opened no swap
file (as strace showed for the parity fixture's nvme_params config). These fixtures are DeepSpeed's losses for
the nvme configs, not evidence of DeepSpeed's I/O; ds has no size floor and writes every partition, which the
tests observe in the files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "integration" / "frameworks"))

from launch import losses, run_script, swap_files, weights  # noqa: E402

COMMAND = "env -u PYTHONPATH DS_ACCELERATOR=cpu /work/refenv-fw/bin/python tools/make_framework_fixtures.py"

# (framework, case name, script under integration/frameworks, its arguments, ranks). With ranks, the script
# runs under torchrun and gets --out DIR appended; with None it starts its own ranks (Lightning's launcher
# re-runs it) and prints one JSON line {"losses": [...], ...} last. The tests look cases up by (framework, name).
L_ARGS = ["--devices", "2", "--steps", "6"]
CASES: list[tuple[str, str, str, list[str], int | None]] = [
    ("trainer", "zero0", "trainer_script.py", ["--stage", "0"], 2),
    ("trainer", "zero2_offload", "trainer_script.py", ["--stage", "2", "--offload"], 2),
    ("trainer", "zero3", "trainer_script.py", ["--stage", "3", "--save"], 2),
    ("trainer", "zero3_nvme", "trainer_script.py", ["--stage", "3", "--nvme"], 2),
    ("accelerate", "zero0", "accelerate_script.py", ["--stage", "0"], 2),
    ("accelerate", "zero2", "accelerate_script.py", ["--stage", "2"], 2),
    ("accelerate", "zero3", "accelerate_script.py", ["--stage", "3"], 2),
    ("accelerate", "zero3_nvme", "accelerate_script.py", ["--stage", "3", "--nvme"], 2),
    ("lightning", "lightning_zero0", "lightning_script.py", ["--stage", "0", *L_ARGS], None),
    ("lightning", "lightning_zero2", "lightning_script.py", ["--stage", "2", *L_ARGS], None),
    ("lightning", "lightning_zero3", "lightning_script.py", ["--stage", "3", *L_ARGS], None),
    (
        "lightning",
        "lightning_stage_3_offload_nvme",
        "lightning_script.py",
        ["--strategy", "deepspeed_stage_3_offload_nvme", "--nvme-path", "nvme", *L_ARGS],
        None,
    ),
    (
        "lightning",
        "lightning_zero1_bf16",
        "lightning_script.py",
        ["--stage", "1", *L_ARGS, "--precision", "bf16-mixed"],
        None,
    ),
]


def run_self_launching(script: str, args: list[str], cwd: Path) -> dict:
    """Run a script that starts its own ranks; the JSON of the last line rank 0 printed."""
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "integration" / "frameworks" / script), *args],
        env=env, capture_output=True, text=True, timeout=900, cwd=cwd,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _nvme_record(out: Path) -> dict:
    """What DeepSpeed left under a case's nvme_path (``OUT/nvme``, the scripts' choice), if it has one."""
    return {"deepspeed_swap_files": swap_files(out / "nvme")} if (out / "nvme").is_dir() else {}


def record(framework: str, out_root: Path, only: list[str], kept: dict) -> dict:
    """Run ``framework``'s cases (those named in ``only``, if any, keeping ``kept``'s record of the others)."""
    cases = {}
    for fw, name, script, args, nproc in CASES:
        if fw != framework:
            continue
        if only and name not in only:
            if name not in kept:
                sys.exit(f"{framework} {name}: not recorded yet; run it too (--only {name})")
            cases[name] = kept[name]
            continue
        out = out_root / f"{fw}-{name}"
        if nproc is None:
            out.mkdir(parents=True)
            result = run_self_launching(script, args, out)
            result.pop("step_seconds", None)  # timing, not a property of the run to compare
            case = {"script": script, "args": args, **result, **_nvme_record(out)}
            cases[name] = case
            print(f"{fw} {name}: {case['losses']}", flush=True)
            continue
        records = run_script(sys.executable, script, *args, "--out", str(out), nproc=nproc)
        case = {"script": script, "args": args, "ranks": nproc, "losses": losses(records)}
        saved = weights(records)
        if saved is not None:
            case["weights"] = saved
        built = [r["optimizer"] for r in records if "optimizer" in r]
        if built:
            case["optimizer"] = built[-1]
        case.update(_nvme_record(out))
        cases[name] = case
        print(f"{fw} {name}: {case['losses']}", flush=True)
    return {
        "deepspeed_version": version("deepspeed"),
        "frameworks": {p: version(p) for p in ("transformers", "accelerate", "lightning", "torch")},
        "command": COMMAND,
        "cases": cases,
    }


def main() -> None:
    import tempfile

    frameworks = sorted({c[0] for c in CASES})
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("framework", nargs="*", help=f"any of {frameworks} (default: all)")
    p.add_argument("--only", action="append", default=[], help="re-record only this case (repeatable)")
    args = p.parse_args()
    unknown = sorted(set(args.framework) - set(frameworks))
    if unknown:
        sys.exit(f"no cases for {unknown}; CASES has {frameworks}")
    if os.environ.get("DS_ACCELERATOR") != "cpu":
        sys.exit("run with DS_ACCELERATOR=cpu (see the command at the top of this file)")
    import deepspeed

    if hasattr(deepspeed, "__ds__"):
        sys.exit("this is ds's deepspeed package; run with the real DeepSpeed 0.19.8 and no ds on PYTHONPATH")
    with tempfile.TemporaryDirectory() as tmp:
        for framework in args.framework or frameworks:
            path = ROOT / "integration" / "frameworks" / "fixtures" / f"{framework}.json"
            kept = json.loads(path.read_text())["cases"] if args.only and path.exists() else {}
            data = record(framework, Path(tmp), args.only, kept)
            path.write_text(json.dumps(data, indent=1) + "\n")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()

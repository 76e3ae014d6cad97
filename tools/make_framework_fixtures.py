"""Record DeepSpeed 0.19.8's step losses for the framework scripts in integration/frameworks.

Run it in an environment with the real ``deepspeed==0.19.8`` and the pinned framework releases (noxfile.py
``FRAMEWORKS``), WITHOUT ds's packages on the path:

    DS_ACCELERATOR=cpu /work/refenv/bin/python tools/make_framework_fixtures.py [--only lightning]

Each case in ``CASES`` runs one script through its framework's own launcher and keeps the JSON line rank 0
prints last (``{"losses": [...], ...}``); the cases of one framework are written together to
``integration/frameworks/fixtures/<framework>.json`` (``{"cases": {name: {"args": [...], "losses": [...]}},
"deepspeed": ..., "command": ...}``). The tests run the same script with the same args on ds and compare.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ROOT / "integration" / "frameworks"

# case name -> (framework, script in integration/frameworks, its arguments). The output file is
# fixtures/<framework>.json. Lightning launches its own ranks (its subprocess launcher re-runs the script).
CASES: dict[str, tuple[str, str, list[str]]] = {
    "lightning_zero0": (
        "lightning",
        "lightning_script.py",
        ["--stage", "0", "--devices", "2", "--steps", "6"],
    ),
    "lightning_zero2": (
        "lightning",
        "lightning_script.py",
        ["--stage", "2", "--devices", "2", "--steps", "6"],
    ),
    "lightning_zero3": (
        "lightning",
        "lightning_script.py",
        ["--stage", "3", "--devices", "2", "--steps", "6"],
    ),
    "lightning_zero2_bf16": (
        "lightning",
        "lightning_script.py",
        ["--stage", "2", "--devices", "2", "--steps", "6", "--precision", "bf16-mixed"],
    ),
}


def run_case(script: str, args: list[str]) -> dict:
    """Run one case; return the JSON of the last line rank 0 printed."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH="")
    proc = subprocess.run(
        [sys.executable, str(FRAMEWORKS / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, help="record only this framework's cases (e.g. lightning)")
    opts = p.parse_args()
    import deepspeed

    if getattr(deepspeed, "__ds__", None):
        raise SystemExit(
            "this imported ds's deepspeed package: run it with the real DeepSpeed and no ds on the path"
        )
    by_framework: dict[str, dict] = {}
    for name, (framework, script, args) in CASES.items():
        if opts.only and framework != opts.only:
            continue
        result = run_case(script, args)
        print(f"{name}: {result['losses']}", flush=True)
        by_framework.setdefault(framework, {})[name] = {"script": script, "args": args, **result}
    for framework, cases in by_framework.items():
        out = FRAMEWORKS / "fixtures" / f"{framework}.json"
        out.parent.mkdir(exist_ok=True)
        doc = {
            "command": "DS_ACCELERATOR=cpu python tools/make_framework_fixtures.py --only " + framework,
            "deepspeed": deepspeed.__version__,
            framework: importlib.metadata.version(framework),
            "torch": importlib.metadata.version("torch"),
            "cases": cases,
        }
        out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

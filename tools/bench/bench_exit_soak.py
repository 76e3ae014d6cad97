"""Soak: launch the 2-rank stage-3 script many times under load and count aborts at interpreter exit.

    python tools/bench/bench_exit_soak.py [--launches 200] [--parallel 2] [--load 1] [--json OUT]

Each launch is ``ds-launch --num_procs 2 integration/scripts/engine_stage3.py`` (a zero.Init model, four
stage-3 steps, a checkpoint and its fp32 export). ``--parallel`` launches run at once and ``--load`` busy
processes spin beside them, so that ranks are descheduled at any point of their exit, as on a shared
machine. A launch counts as an abort when it exits non-zero or any rank printed ``terminate called`` (the
C++ runtime's message when a thread is unwound out of torch during interpreter teardown). The record
(command, commit, versions, load average before and after, every failing launch's tail) goes to --json;
each launch is also appended to --json's .progress.jsonl as it ends, so a run cut short keeps its results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "integration" / "scripts"


def _spin(stop: multiprocessing.Event) -> None:  # type: ignore[valid-type]
    while not stop.is_set():
        sum(range(10000))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    paths += [str(ROOT / "testing"), str(ROOT), str(SCRIPTS)]
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _launch(i: int, work: Path, env: dict[str, str]) -> dict:
    out = work / f"l{i}"
    out.mkdir()
    cmd = [sys.executable, "-m", "ds_launch.cli", "--num_procs", "2", str(SCRIPTS / "engine_stage3.py")]
    start = time.monotonic()
    proc = subprocess.run(
        [*cmd, str(out / "out.json"), str(out / "ckpt")],
        capture_output=True, text=True, env=env, timeout=300, cwd=work,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    aborted = proc.returncode != 0 or "terminate called" in text
    return {"launch": i, "rc": proc.returncode, "seconds": time.monotonic() - start, "aborted": aborted,
            "tail": text[-1500:] if aborted else ""}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=2, help="launches running at once")
    parser.add_argument("--load", type=int, default=1, help="busy processes beside the launches")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args()
    env = _env()
    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.load)]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    for s in spinners:
        s.start()
    start = time.monotonic()
    try:
        progress = args.json.with_suffix(".progress.jsonl") if args.json else None
        if progress is not None:
            progress.parent.mkdir(parents=True, exist_ok=True)
            progress.write_text("")

        def launch(i: int, tmp: Path) -> dict:
            result = _launch(i, tmp, env)
            if progress is not None:  # each launch as it ends: a run cut short keeps what it saw
                with progress.open("a") as f:
                    f.write(json.dumps(result) + "\n")
            return result

        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda i: launch(i, Path(tmp)), range(args.launches)))
    finally:
        stop.set()
        for s in spinners:
            s.join()
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    aborts = [r for r in results if r["aborted"]]
    seconds = sorted(r["seconds"] for r in results)
    record = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),  # fmt: skip
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "launches": args.launches,
        "parallel": args.parallel,
        "busy_processes": args.load,
        "aborts": len(aborts),
        "launch_seconds_median": seconds[len(seconds) // 2],
        "launch_seconds_range": [seconds[0], seconds[-1]],
        "wall_seconds": time.monotonic() - start,
        "failed": aborts,
    }
    print(f"{len(aborts)} aborts in {args.launches} launches ({args.parallel} at once, {args.load} busy "
          f"processes; load {' '.join(load_before)} -> {' '.join(load_after)}); median launch "
          f"{record['launch_seconds_median']:.1f} s")  # fmt: skip
    for r in aborts:
        print(f"--- launch {r['launch']} rc={r['rc']}\n{r['tail']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

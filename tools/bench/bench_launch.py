"""Time from starting a launcher to the first completed all-reduce on every rank, launcher by launcher.

    .venv/bin/python tools/bench/bench_launch.py [--procs 4] [--repeats 1]

Compares ``ds-launch`` (local and its mpi launcher), plain ``mpirun -n``, ``torchrun`` and, when
The venv of $DS_DEEPSPEED_PYTHON holds DeepSpeed, its ``deepspeed --num_gpus`` runner (DS_ACCELERATOR=cpu), all
running the same rank script. Prints a markdown table; the figure per launcher is the median over
repeats of (latest rank's all-reduce completion - launcher start), plus the launcher's total wall time.
The "floor" rows time plain interpreters that only import torch, 1 and --procs of them at once: no
launcher that starts fresh Python processes can reach its first all-reduce sooner.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import provenance, write  # tools/bench: this script's folder, first on sys.path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _bin(name: str) -> str:
    """``name`` from this python's venv, else from PATH (mpirun is usually the system's)."""
    mine = VENV_BIN / name
    return str(mine) if mine.is_file() else shutil.which(name) or name


# the bin folder of a venv with DeepSpeed 0.19.8 (its python given by DS_DEEPSPEED_PYTHON); absent: not run
DEEPSPEED_BIN = Path(os.environ.get("DS_DEEPSPEED_PYTHON", "deepspeed-python-not-set")).parent

RANK_SCRIPT = r"""
import os, sys, time
from pathlib import Path
import torch
import torch.distributed as dist
torch.set_num_threads(1)
try:  # the same script runs in DeepSpeed's venv, which has no ds_launch
    from ds_launch import init_distributed
    rank = init_distributed(backend="gloo").rank
except ImportError:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
x = torch.ones(1)
dist.all_reduce(x)
Path(os.environ["BENCH_OUT"], f"rank{rank}").write_text(repr(time.time()))
dist.destroy_process_group()
"""


def _mpi_env() -> dict[str, str]:
    env = {}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def launchers(script: Path, procs: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Name -> (command, extra environment) for every launcher available here."""
    py = sys.executable
    oversubscribe = "--oversubscribe" if (os.cpu_count() or 1) < procs else ""
    found = {
        f"ds-launch --num_procs {procs}": (
            [_bin("ds-launch"), "--num_procs", str(procs), str(script)],
            {},
        ),
        f"ds-launch --launcher mpi --num_procs {procs}": (
            [
                _bin("ds-launch"),
                "--launcher",
                "mpi",
                "--num_procs",
                str(procs),
                f"--launcher_args={oversubscribe}",
                str(script),
            ],
            _mpi_env(),
        ),
        f"mpirun -n {procs}": (
            [
                _bin("mpirun"),
                "-n",
                str(procs),
                *([oversubscribe] if oversubscribe else []),
                py,
                "-u",
                str(script),
            ],
            _mpi_env(),
        ),
        f"torchrun --nproc_per_node {procs}": (
            [_bin("torchrun"), "--nproc_per_node", str(procs), str(script)],
            {"OMP_NUM_THREADS": "1"},
        ),
    }
    if (DEEPSPEED_BIN / "deepspeed").is_file():
        found[f"deepspeed --num_gpus {procs} (DS_ACCELERATOR=cpu)"] = (
            [
                str(DEEPSPEED_BIN / "python"),
                str(DEEPSPEED_BIN / "deepspeed"),
                "--num_gpus",
                str(procs),
                str(script),
            ],
            {"DS_ACCELERATOR": "cpu", "PATH": f"{DEEPSPEED_BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        )
    return found


def time_one(cmd: list[str], extra_env: dict[str, str], procs: int, timeout_s: float) -> tuple[float, float]:
    """(seconds to the last rank's first completed all-reduce, seconds until the launcher exited)."""
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, **extra_env, "BENCH_OUT": out}
        start = time.time()
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        wall = time.time() - start
        done = [float(p.read_text()) for p in Path(out).glob("rank*")]
        if res.returncode != 0 or len(done) != procs:
            raise RuntimeError(
                f"{cmd[0]} failed (rc {res.returncode}, {len(done)} ranks):\n{res.stderr[-2000:]}"
            )
        return max(done) - start, wall


IMPORT_ONLY = "import time, torch; print(repr(time.time()))"


def time_imports(procs: int) -> float:
    """Seconds until ``procs`` plain interpreters started at once have all imported torch: the floor
    under any launcher that starts fresh Python processes (no launcher, no rendezvous, no all-reduce)."""
    start = time.time()
    ps = [
        subprocess.Popen([sys.executable, "-c", IMPORT_ONLY], stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    done = [float(p.communicate()[0]) for p in ps]
    return max(done) - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--json", default=None, help="write the record (tools/bench/_record.py's envelope) here"
    )
    args = parser.parse_args()
    started = provenance()
    workdir = Path(tempfile.mkdtemp(prefix="bench_launch_"))
    script = workdir / "allreduce_once.py"
    script.write_text(RANK_SCRIPT)
    floors = {n: [time_imports(n) for _ in range(args.repeats)] for n in sorted({1, args.procs})}
    runs: dict[str, list[tuple[float, float]]] = {}
    failed: dict[str, str] = {}
    try:
        found = launchers(script, args.procs)
        for _ in range(args.repeats):  # launchers alternate, round by round
            for name, (cmd, extra) in found.items():
                if name in failed:
                    continue
                try:
                    runs.setdefault(name, []).append(time_one(cmd, extra, args.procs, args.timeout))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failed[name] = str(exc).splitlines()[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = [
        f"| floor: {n} x `python -c 'import torch'` at once | {statistics.median(t):.2f} | | no launcher |"
        for n, t in floors.items()
    ]
    medians = {}
    for name in found:
        if name in failed:
            rows.append(f"| `{name}` | failed | failed | {failed[name]} |")
            continue
        first, wall = (statistics.median(r[i] for r in runs[name]) for i in (0, 1))
        medians[name] = {"first_allreduce_s": first, "launcher_wall_s": wall}
        rows.append(f"| `{name}` | {first:.2f} | {wall:.2f} | |")
    print(
        f"{args.procs} ranks, gloo, CPU, median of {args.repeats} alternating run(s), {os.cpu_count()} cores\n"
    )
    print("| launcher | start -> first all-reduce done (s) | launcher wall (s) | note |")
    print("|---|---|---|---|")
    print("\n".join(rows))
    write(args.json, {"settings": vars(args), "import_floor_s": floors, "median": medians,
                      "runs_first_allreduce_and_wall_s": runs, "failed": failed}, started)  # fmt: skip


if __name__ == "__main__":
    main()

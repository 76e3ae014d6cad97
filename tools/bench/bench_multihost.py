#!/usr/bin/env python
"""ds across hosts, measured on namespace test hosts (testing/hosts): training speed, link bandwidth, and how
long a fault takes to end a job. Needs root (network namespaces).

    sudo .venv/bin/python tools/bench/bench_multihost.py                     # everything (about 10 minutes)
    sudo .venv/bin/python tools/bench/bench_multihost.py --only faults       # one part: train, bandwidth, faults

- **train**: the 13.3M-parameter GPT of docs/benchmarks.md (tools/bench/_bench_cases.py ``gpt13m``, fp32, client
  AdamW) at ZeRO 2 and 3, 2 hosts x 2 ranks against 1 host x 4 ranks, both through ``ds-launch --hostfile``
  (mpirun, the hosts' ssh-like agent, ZeRO's collectives on their default path); the time from starting
  ds-launch to the end of the first step on every rank, and the median step time after ``--warmup``.
- **bandwidth**: one rank on each of 2 hosts, an fp32 all-reduce of ``--mib`` MiB over torch.distributed's
  gloo and over ds-zero's host transport (MPI under mpirun), the same link (a veth pair through a bridge:
  the kernel's network stack on one machine, not a NIC, so the figure bounds software, not wire, speed).
- **faults**: 2 hosts x 2 ranks all-reducing in a loop (packages/ds-launch/tests/scripts/hosts_rank.py) with
  ds-launch's default monitor timeouts; each fault is made at step 20 and timed to ds-launch's exit, and for
  a partition also to the moment the cut-off host has no rank left (its ranks' beaters end them; counted
  inside the host while it is still cut off). ``--fault KIND`` measures only those kinds.

Prints markdown tables; every figure comes from one run of this script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "testing"), str(ROOT / "tools" / "bench")]

from hosts import Cluster  # noqa: E402

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONUNBUFFERED": "1"}
FAULT_SCRIPT = ROOT / "packages" / "ds-launch" / "tests" / "scripts" / "hosts_rank.py"

TRAIN_RANK = r"""
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
import ds_engine, ds_zero
from _bench_cases import MODELS, build_model, batch, engine_config
torch.set_num_threads(1)
out, stage, steps, warmup = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
d = MODELS["gpt13m"]
spec = {"impl": "ds", "stage": stage, "dtype": "fp32"}
ds_engine.init_distributed()
model = build_model(spec, d)
engine, *_ = ds_engine.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                                  config=engine_config(spec, d))
rank = dist.get_rank()
times, first = [], None
for step in range(steps):
    idx, tgt = batch(d, rank, step)
    t0 = time.perf_counter()
    engine.backward(engine(idx, tgt))
    engine.step()
    dist.barrier()
    times.append(time.perf_counter() - t0)
    if first is None:
        first = time.time()
if rank == 0:
    json.dump({"first_step_at": first, "step_s": statistics.median(times[warmup:]),
               "mpi": ds_zero.mpi_collective_calls(), "shm": ds_zero.shm_collective_calls()}, open(out, "w"))
"""

BANDWIDTH_RANK = r"""
import json, sys, time
import torch, torch.distributed as dist
import ds_engine
from ds_zero import _transport
torch.set_num_threads(1)
out, mib, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds_engine.init_distributed()
x = torch.ones(mib * 2**18)
host = _transport.enable(None)
res = {"transport": host.kind if host else "none"}
for name in ("gloo", "ds"):
    if name == "ds" and host is None:
        continue
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if name == "gloo":
            dist.all_reduce(x)
        else:
            host.all_reduce([x]).wait()
        times.append(time.perf_counter() - t0)
    res[name] = min(times[1:])
if dist.get_rank() == 0:
    json.dump(res, open(out, "w"))
"""


def _launch(
    cluster: Cluster, hostfile: Path, script: Path, *args: str, launcher_args: str = ""
) -> tuple[int, str]:
    argv = ["ds-launch", "--hostfile", str(hostfile), "--launcher", "mpi",
            # the hosts share this machine's cores: no binding (mpirun would bind both hosts' ranks to the same
            # cores), and 1 host x 4 ranks on 2 cores is oversubscribed
            "--launcher_args", f"--mca plm_rsh_agent {cluster.ssh} --bind-to none --oversubscribe {launcher_args}",
            str(script), *args]  # fmt: skip
    proc = cluster.run("node0", argv, env=MPI_ENV, cwd=str(cluster.shared), timeout=1800)
    return proc.returncode, proc.stdout + proc.stderr


def train(cluster: Cluster, steps: int, warmup: int, stages: list[int]) -> list[str]:
    script = cluster.shared / "train_rank.py"
    script.write_text(TRAIN_RANK)
    rows = [
        "| ZeRO | layout | launch to first step (s) | step (s, median) | collectives over |",
        "|---|---|---|---|---|",
    ]
    for stage in stages:
        for layout, slots in (("2 hosts x 2", {"node0": 2, "node1": 2}), ("1 host x 4", {"node0": 4})):
            hostfile = cluster.hostfile(cluster.shared / "train.hosts", slots=slots, names=list(slots))
            out = cluster.shared / f"train-{stage}-{len(slots)}.json"
            t0 = time.time()
            code, log = _launch(cluster, hostfile, script, str(ROOT / "tools" / "bench"), str(out), str(stage), str(steps),
                                str(warmup), launcher_args="-x OMP_NUM_THREADS=1")  # fmt: skip
            if code != 0:
                raise SystemExit(f"train {stage} {layout} failed:\n{log[-4000:]}")
            r = json.loads(out.read_text())
            path = "MPI" if r["mpi"] else ("shared memory" if r["shm"] else "gloo")
            rows.append(
                f"| {stage} | {layout} | {r['first_step_at'] - t0:.1f} | {r['step_s']:.3f} | {path} |"
            )
            print(rows[-1], flush=True)
    return rows


def bandwidth(cluster: Cluster, mib: int, repeats: int) -> list[str]:
    script = cluster.shared / "bandwidth_rank.py"
    script.write_text(BANDWIDTH_RANK)
    hostfile = cluster.hostfile(cluster.shared / "bw.hosts", slots=1, names=["node0", "node1"])
    out = cluster.shared / "bw.json"
    code, log = _launch(cluster, hostfile, script, str(out), str(mib), str(repeats))
    if code != 0:
        raise SystemExit(f"bandwidth failed:\n{log[-4000:]}")
    r = json.loads(out.read_text())
    rows = [f"| all-reduce of {mib} MiB fp32, 2 hosts x 1 rank | time (s, best of {repeats}) | algorithm bandwidth (MiB/s) |",
            "|---|---|---|"]  # fmt: skip
    for name, label in (
        ("gloo", "torch.distributed (gloo)"),
        ("ds", f"ds-zero host transport ({r['transport']})"),
    ):
        if name in r:
            rows.append(f"| {label} | {r[name]:.3f} | {mib / r[name]:.0f} |")
    return rows


def _ranks_left(cluster: Cluster, host: str) -> int:
    left = 0
    for pid in cluster.pids(host):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        left += FAULT_SCRIPT.name.encode() in cmdline and state != "Z"
    return left


def faults(cluster: Cluster, kinds: list[str]) -> list[str]:
    hostfile = cluster.hostfile(cluster.shared / "faults.hosts", slots=2, names=["node0", "node1"])
    rows = ["| fault (at step 20, on node1) | fault to ds-launch's exit (s) | fault to node1's ranks gone (s) | exit code | what ds-launch said first |",
            "|---|---|---|---|---|"]  # fmt: skip
    for kind in kinds:
        out = cluster.shared / f"fault-{kind}"
        out.mkdir()
        script_args = [str(out), "100000"] + (["hang", "3", "20"] if kind == "hang" else [])
        script_args += ["raise", "3", "20"] if kind == "raise" else []
        argv = ["ds-launch", "--hostfile", str(hostfile), "--launcher_args", f"--mca plm_rsh_agent {cluster.ssh}",
                str(FAULT_SCRIPT), *script_args]  # fmt: skip
        job = cluster.popen("node0", argv, env=MPI_ENV, cwd=str(cluster.shared), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
        progress = out / "progress3"
        while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 19):
            if job.poll() is not None:
                raise SystemExit(f"fault {kind}: the job ended early:\n{job.communicate()[0][-3000:]}")
            time.sleep(0.02)
        t_fault = time.monotonic()
        if kind == "lost":
            cluster.kill_host("node1")
        elif kind == "partition":
            cluster.partition("node1")
        gone = "-"
        if kind == "partition":  # still cut off: when do its ranks end by themselves?
            while _ranks_left(cluster, "node1") and time.monotonic() - t_fault < 300:
                time.sleep(0.1)
            gone = f"{time.monotonic() - t_fault:.1f}" if not _ranks_left(cluster, "node1") else "> 300"
        log = job.communicate(timeout=600)[0]
        took = time.monotonic() - t_fault
        cluster.heal("node1")
        cluster.kill_host("node1")  # what a partition left behind
        cluster.heal("node1")
        said = next(
            (ln for ln in log.splitlines() if ln.startswith("ds-launch:") and "running" not in ln), ""
        )
        rows.append(
            f"| {kind} | {took:.1f} | {gone} | {job.returncode} | {said.removeprefix('ds-launch: ')[:110]} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", choices=["train", "bandwidth", "faults"], action="append")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument(
        "--stages", type=int, nargs="+", default=[2, 3], choices=[0, 1, 2, 3], help="ZeRO stages to train"
    )
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--fault", choices=["lost", "partition", "hang", "raise"], action="append")
    args = p.parse_args()
    parts = args.only or ["train", "bandwidth", "faults"]
    with Cluster(2, private_tmp=True) as cluster:
        tables = []
        if "train" in parts:
            tables.append(train(cluster, args.steps, args.warmup, args.stages))
        if "bandwidth" in parts:
            tables.append(bandwidth(cluster, args.mib, args.repeats))
        if "faults" in parts:
            tables.append(faults(cluster, args.fault or ["lost", "partition", "hang", "raise"]))
    print()
    for table in tables:
        print("\n".join(table) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""ZeRO-3 across 2 namespace hosts on a limited link, with and without ZeRO++ (hpZ, int8 weights, 4-bit
gradients), side by side in one run. Needs root (network namespaces, tc).

    sudo .venv/bin/python tools/bench/bench_zeropp_hosts.py --repeats 3

The model is the 13.3M-parameter GPT ``lean`` of tools/bench/_bench_cases.py (fp32, client AdamW, ZeRO-3).
Both hosts' ``eth0`` (the veth to the bridge) get ``tc qdisc ... netem rate 1gbit delay 0.2ms``. Cases:

- ``1host``: 1 host x 4 ranks, plain ZeRO-3 (the ranks talk over the host's loopback);
- ``plain``: 2 hosts x 2 ranks, plain ZeRO-3;
- ``hpz``: 2 x 2 with ``zero_hpz_partition_size: 2``;
- ``qwqg``: 2 x 2 with ``zero_quantized_weights`` and ``zero_quantized_gradients``;
- ``zeropp``: 2 x 2 with all three.

Each layout is one ``ds-launch --hostfile`` job (mpirun; a launch costs minutes on a loaded machine): the
2-host job runs its cases one after another, a fresh engine each, in alternating order for ``--repeats``
rounds; then the 1-host job its rounds. ``DS_ZERO_COLLECTIVES=torch``: every case's collectives are gloo's
(the one-host case would otherwise take shared memory). Figures: medians over the rounds with the spread
(min-max). Step time: a run's median step after ``--warmup``. Cross-host bytes per step: node0's
``/sys/class/net/eth0/statistics`` (rx + tx) over the timed steps, divided by their number (every byte
between the two hosts passes it), beside the formula's (``FORMULA``). Writes a JSON record (``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "testing"), str(ROOT / "tools" / "bench")]

from hosts import Cluster  # noqa: E402

MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PYTHONUNBUFFERED": "1",
           "DS_ZERO_COLLECTIVES": "torch", "OMP_NUM_THREADS": "1"}  # fmt: skip
NETEM = ["netem", "rate", "1gbit", "delay", "0.2ms"]
TBF = ["tbf", "rate", "1gbit", "burst", "128kb", "latency", "50ms"]  # rate only, where netem is missing

# every case: parameters released after their forward and gathered again in backward (with DeepSpeed's
# default reuse distance a model this small stays whole from forward to backward, which no ZeRO-3 model that
# needs ZeRO-3 does; DeepSpeed's own ZeRO++ convergence test sets it to 0 too)
BASE = {"stage3_max_reuse_distance": 0}
QWQG = {"zero_quantized_weights": True, "zero_quantized_gradients": True}
CASES: dict[str, tuple[dict, dict]] = {  # name -> (hostfile slots, ZeRO keys)
    "1host": ({"node0": 4}, BASE),
    "plain": ({"node0": 2, "node1": 2}, BASE),
    "hpz": ({"node0": 2, "node1": 2}, {**BASE, "zero_hpz_partition_size": 2}),
    "qwqg": ({"node0": 2, "node1": 2}, {**BASE, **QWQG}),
    "zeropp": ({"node0": 2, "node1": 2}, {**BASE, **QWQG, "zero_hpz_partition_size": 2}),
}
# The formula: cross-host bytes per step per gathered element P (parameters above the persistence
# threshold), where a gather brings each host the other host's half once (4P bytes in fp32, both hosts
# together; int8: P), and a plain reduction sends each rank's other-host half to its owners (8P), qgZ's
# cross-host all-to-all sends each rank's quarter at 4 bits (P/2). Scales and headers are left out.
FORMULA = {"plain": 2 * 4 + 8, "hpz": 4 + 8, "qwqg": 2 * 1 + 0.5, "zeropp": 1 + 0.5, "1host": 0}

RANK = r"""
import dataclasses, gc, json, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
import ds_engine
from _bench_cases import MODELS, build_model, batch, engine_config
torch.set_num_threads(1)
out, cases, rounds, steps, warmup = sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
d = dataclasses.replace(MODELS["lean"], micro_batch=int(sys.argv[7]))
ds_engine.init_distributed()
rank = dist.get_rank()

def wire():
    stats = "/sys/class/net/eth0/statistics/"
    return sum(int(open(stats + k).read()) for k in ("rx_bytes", "tx_bytes"))

def run(zero):
    spec = {"impl": "ds", "stage": 3, "dtype": "fp32", "zero": zero}
    model = build_model(spec, d)
    engine, *_ = ds_engine.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4),
                                      config=engine_config(spec, d))
    times, losses = [], []
    for step in range(steps):
        if step == warmup:
            dist.barrier()
            b0 = wire()
        idx, tgt = batch(d, rank, step)
        t0 = time.perf_counter()
        loss = engine(idx, tgt)
        engine.backward(loss)
        engine.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    b1 = wire()
    gathered = sum(s.numel for s in engine.optimizer.params.slots.values() if not s.persistent)
    engine.optimizer.remove_hooks()
    return {"step_s": statistics.median(times[warmup:]), "bytes_per_step": (b1 - b0) / (steps - warmup),
            "losses": losses, "gathered_numel": gathered}

results = {name: [] for name in cases}
for r in range(rounds):
    for name in (list(cases) if r % 2 == 0 else list(reversed(cases))):
        results[name].append(run(cases[name]))
        gc.collect()
        if rank == 0:
            print(f"round {r} {name}: {results[name][-1]['step_s']:.3f} s/step, "
                  f"{results[name][-1]['bytes_per_step'] / 1e6:.1f} MB/step", flush=True)
if rank == 0:
    json.dump(results, open(out, "w"))
"""


def _launch(cluster: Cluster, hostfile: Path, script: Path, *args: str) -> tuple[int, str]:
    xs = " ".join(f"-x {k}" for k in ("DS_ZERO_COLLECTIVES", "OMP_NUM_THREADS"))
    argv = ["ds-launch", "--hostfile", str(hostfile), "--launcher", "mpi",
            # the hosts share this machine's cores: no binding, and 4 ranks on fewer cores oversubscribe
            "--launcher_args", f"--mca plm_rsh_agent {cluster.ssh} --bind-to none --oversubscribe {xs}",
            str(script), *args]  # fmt: skip
    env = dict(MPI_ENV)
    found = shutil.which(
        "ds-launch"
    )  # where the caller's ds-launch is (a login's PATH has only python's bin)
    if found:
        env["PATH"] = f"{Path(found).parent}:{Path(sys.executable).parent}:/usr/sbin:/usr/bin:/sbin:/bin"
    proc = cluster.run("node0", argv, env=env, cwd=str(cluster.shared), timeout=3600)
    print(proc.stdout[-3000:], flush=True)
    return proc.returncode, proc.stdout + proc.stderr


def _limit_link(cluster: Cluster) -> str:
    """Limit both hosts' eth0 with netem (rate and delay), else tbf (rate only; said in the record)."""
    for qdisc in (NETEM, TBF):
        done = [subprocess.run(cluster.enter_argv(h, ["tc", "qdisc", "add", "dev", "eth0", "root", *qdisc]),
                               capture_output=True, text=True) for h in ("node0", "node1")]  # fmt: skip
        if all(d.returncode == 0 for d in done):
            note = "" if qdisc is NETEM else " (netem is not in this kernel: no added delay)"
            return "tc qdisc add dev eth0 root " + " ".join(qdisc) + " on both hosts" + note
        print(f"tc {qdisc[0]}: {done[0].stderr.strip() or done[1].stderr.strip()}", flush=True)
    raise SystemExit("cannot limit the link with tc (neither netem nor tbf)")


def _job(
    cluster: Cluster,
    script: Path,
    slots: dict,
    names: list[str],
    rounds: int,
    steps: int,
    warmup: int,
    micro_batch: int,
) -> dict:
    """One ds-launch job on ``slots`` running each case of ``names`` in turn, ``rounds`` times, alternating."""
    hostfile = cluster.hostfile(cluster.shared / f"{len(slots)}.hosts", slots=slots, names=list(slots))
    out = cluster.shared / f"{len(slots)}hosts.json"
    cases = json.dumps({n: CASES[n][1] for n in names})
    code, log = _launch(cluster, hostfile, script, str(ROOT / "tools" / "bench"), str(out), cases, str(rounds),
                        str(steps), str(warmup), str(micro_batch))  # fmt: skip
    if code != 0:
        raise SystemExit(f"{names} failed:\n{log[-4000:]}")
    return json.loads(out.read_text())


def _spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--micro-batch", type=int, default=2, help="sequences of 64 tokens per rank and step: the "
                   "compute a step's cross-host bytes are set against (the bytes do not grow with it)")  # fmt: skip
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "zeropp-hosts.json")
    args = p.parse_args()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    results: dict[str, list[dict]] = {}
    with Cluster(2, private_tmp=True) as cluster:
        link = _limit_link(cluster)
        script = cluster.shared / "zeropp_rank.py"
        script.write_text(RANK)
        # one job per layout (a launch costs minutes on a loaded machine): the two-host job, whose cases
        # alternate round by round inside it, then the one-host job
        for slots in ({"node0": 2, "node1": 2}, {"node0": 4}):
            names = [n for n in args.cases if CASES[n][0] == slots]
            if names:
                results.update(
                    _job(
                        cluster, script, slots, names, args.repeats, args.steps, args.warmup, args.micro_batch
                    )
                )
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    summary = {
        name: {
            "step_s": _spread([x["step_s"] for x in runs]),
            "cross_host_mb_per_step": _spread([x["bytes_per_step"] / 1e6 for x in runs]),
            "losses_first_run": runs[0]["losses"],
            "formula_mb_per_step": FORMULA[name] * runs[0]["gathered_numel"] / 1e6,
        }
        for name, runs in results.items()
    }
    ratios = {}
    med = {n: s["step_s"]["median"] for n, s in summary.items()}
    mb = {n: s["cross_host_mb_per_step"]["median"] for n, s in summary.items()}
    if "1host" in med:
        ratios.update({f"{n}_step_vs_1host": med[n] / med["1host"] for n in med if n != "1host"})
    if "plain" in mb:
        ratios.update({f"{n}_bytes_vs_plain": mb[n] / mb["plain"] for n in mb if n not in ("plain", "1host")})
    import torch

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    record = {
        "command": "python tools/bench/bench_zeropp_hosts.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after},
        "link": link,
        "model": f"lean (13.3M GPT, fp32, ZeRO-3, micro batch {args.micro_batch} x 64 tokens per rank)",
        "steps": args.steps,
        "warmup": args.warmup,
        "summary": summary,
        "ratios": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(
        "\n| case | step (s, median) | spread | cross-host MB/step (median) | spread |\n|---|---|---|---|---|"
    )
    for n, s in summary.items():
        st, b = s["step_s"], s["cross_host_mb_per_step"]
        print(f"| {n} | {st['median']:.3f} | {st['min']:.3f}-{st['max']:.3f} | {b['median']:.1f} | "
              f"{b['min']:.1f}-{b['max']:.1f} |")  # fmt: skip
    print(json.dumps(ratios, indent=1))
    print({n: round(s["cross_host_mb_per_step"]["median"] / s["formula_mb_per_step"], 2)
           for n, s in summary.items() if s["formula_mb_per_step"]})  # fmt: skip


if __name__ == "__main__":
    main()

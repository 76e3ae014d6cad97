#!/usr/bin/env python
"""ZeRO's collectives over MPI (ds_zero/_mpi.py) and over shared memory (ds_zero/_shm.py) against the same
calls over gloo, in one mpirun job.

On the lean GPT's gradients (tools/bench/_bench_cases.py, 13.3M fp32 parameters, 53 MB), each rank times
ds_zero's own entry points through each transport (MPI, shared memory, none: gloo), interleaved run by run:
- stage 0: ``all_reduce_async`` of every gradient in place (``_reducer.py`` launches exactly this);
- stages 1-3: ``reduce_to_owners`` of every gradient as its own segment, summed to the owners of its
  slices (gloo: the method ``_comm.py`` picks for the size);
- the weight gather: ``all_gather_views`` of the partitions of one flat buffer;
each alone, then launched before a compute loop (matmuls standing in for the rest of backward) and
waited after it, which shows what the launch costs the computing thread and how much of the
collective hides behind it. Then raw mpi4py calls on the same gradients, the alternatives the
transport's design was chosen from (blocking per gradient on a worker thread, not ``Iallreduce``: Open MPI
progresses non-blocking collectives only while someone polls). fp32, median of ``--reps`` runs after 2 warm-ups, each run as long as its
slowest rank.

    .venv/bin/python tools/bench/bench_zero_mpi.py --world 2,4 --json bench_zero_mpi.json
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

from _record import load_average, provenance  # tools/bench: this script's folder, first on sys.path

TOOLS = Path(__file__).resolve().parent


def _rank_main(reps: int) -> None:
    from mpi4py import MPI  # imported first, as ds_launch's discovery does under mpirun

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["BENCH_PORT"], RANK=str(rank), WORLD_SIZE=str(world)
    )
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(TOOLS))
    import _bench_cases as bc
    from ds_zero import _comm, _mpi, _shm, _transport
    from ds_zero._layout import GroupLayout

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    carriers = {"mpi": _mpi.enable(None, _transport._agree), "shm": _shm.enable(None, _transport._agree)}
    assert all(carriers.values()), f"a transport does not qualify here: {carriers}"
    key = id(dist.group.WORLD)
    tables = {name: {key: (dist.group.WORLD, t)} for name, t in carriers.items()}
    tables["gloo"] = {}

    grads = [torch.randn_like(p) for p in bc.make_model(bc.MODELS["lean"]).parameters()][::-1]
    layout = GroupLayout.build([g.shape for g in grads], world)
    segments = list(zip(layout.offsets, (g.view(-1) for g in grads)))
    flat = torch.randn(layout.padded_numel)
    part = layout.partition_numel
    views = [flat[r * part : (r + 1) * part] for r in range(world)]
    a, b = torch.randn(384, 384), torch.randn(384, 384)

    def compute() -> None:
        x = a
        for _ in range(40):
            x = torch.tanh(x @ b)

    def stage0():
        works = _comm.all_reduce_async(grads, None)
        return lambda: [w.wait() for w in works]

    def to_owners():
        red = _comm.reduce_to_owners(segments, layout, 0, layout.numel, None)
        return red.wait

    def gather():
        _comm.all_gather_views(views, rank, None)
        return lambda: None

    def timed(launch, overlap: bool) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        wait = launch()
        if overlap:
            compute()
        wait()
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    def raw(fn):  # mpi4py alone, no ds_zero: the alternatives the transport's design was chosen from
        def launch():
            fn()
            return lambda: None

        return launch

    arrays = [g.numpy() for g in grads]
    flat_np = torch.cat([g.view(-1) for g in grads]).numpy()
    n = flat_np.size // world * world
    scattered = torch.empty(n // world).numpy()

    def iallreduce() -> None:
        MPI.Request.Waitall([comm.Iallreduce(MPI.IN_PLACE, x) for x in arrays])

    raw_cases = {
        "raw: Allreduce per gradient (blocking)": lambda: [comm.Allreduce(MPI.IN_PLACE, x) for x in arrays],
        "raw: Iallreduce per gradient, then Waitall": iallreduce,
        "raw: one Allreduce of all gradients flat": lambda: comm.Allreduce(MPI.IN_PLACE, flat_np),
        "raw: Reduce_scatter_block of all gradients flat": lambda: comm.Reduce_scatter_block(
            flat_np[:n], scattered
        ),
        "raw: Allgather in place of all gradients flat": lambda: comm.Allgather(MPI.IN_PLACE, flat_np[:n]),
    }
    raw_ms = {}
    for name, fn in raw_cases.items():
        raw_ms[name] = statistics.median([timed(raw(fn), False) for _ in range(reps + 2)][2:]) * 1e3

    results = []
    compute_alone = []
    for name, launch in (("stage 0 all-reduce", stage0), ("reduce to owners", to_owners), ("gather", gather)):
        for overlap in (False, True):
            if name == "gather" and overlap:
                continue  # the gather is synchronous (the step waits for it)
            times: dict[str, list[float]] = {name: [] for name in tables}
            for i in range(reps + 2):
                for transport, table in tables.items():
                    _transport._transports.clear()
                    _transport._transports.update(table)
                    t = timed(launch, overlap)
                    if i >= 2:
                        times[transport].append(t)
                if overlap and i >= 2:
                    compute_alone.append(timed(lambda: lambda: None, True))
            results.append(
                {
                    "collective": name,
                    "with compute": overlap,
                    **{k: statistics.median(v) * 1e3 for k, v in times.items()},
                    "runs ms": {k: [t * 1e3 for t in v] for k, v in times.items()},  # the spread
                }
            )
    if rank == 0:
        report = {
            "world": world,
            "mib": sum(g.numel() for g in grads) * 4 / 2**20,
            "compute alone ms": statistics.median(compute_alone) * 1e3,
            "results": results,
            "raw mpi4py ms": raw_ms,
        }
        print("RESULT " + json.dumps(report), flush=True)
    dist.destroy_process_group()
    comm.Barrier()
    MPI.Finalize()
    os._exit(0)  # gloo's threads may still drop tensors at shutdown (see ds-zero's tests/_mpi_main.py)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="2,4", help="comma-separated world sizes")
    parser.add_argument("--reps", type=int, default=11, help="timed runs per figure")
    parser.add_argument("--json", default="bench_zero_mpi.json", help="where to write the figures")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)  # internal: one mpirun rank
    args = parser.parse_args()
    if args.rank:
        _rank_main(args.reps)
        return
    started = provenance()
    sys.path.insert(0, str(TOOLS.parents[1] / "testing"))
    from rank_testing import free_port

    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    reports = []
    for world in (int(w) for w in args.world.split(",")):
        cmd = [mpirun, *root, "-np", str(world), "--oversubscribe", "--bind-to", "none", sys.executable,
               __file__, "--rank", "--reps", str(args.reps)]  # fmt: skip
        env = {**os.environ, "BENCH_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            sys.exit(f"{world} ranks failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        rep = json.loads(line[0][len("RESULT ") :])
        reports.append(rep)
        print(
            f"\n{world} ranks, {rep['mib']:.1f} MiB of fp32 gradients; compute loop alone "
            f"{rep['compute alone ms']:.1f} ms\n\n| collective | with compute | MPI ms | shared memory ms "
            "| gloo ms | MPI / gloo | shared memory / gloo |\n|---|---|---|---|---|---|---|"
        )
        for r in rep["results"]:
            print(
                f"| {r['collective']} | {'yes' if r['with compute'] else 'no'} | {r['mpi']:.1f} | {r['shm']:.1f} | "
                f"{r['gloo']:.1f} | {r['mpi'] / r['gloo']:.2f}x | {r['shm'] / r['gloo']:.2f}x |"
            )
        print("\n| raw mpi4py on the same gradients | ms |\n|---|---|")
        for name, ms in rep["raw mpi4py ms"].items():
            print(f"| {name[5:]} | {ms:.1f} |")
    record = {**started, "reports": reports, "load_average_end": load_average()}
    Path(args.json).write_text(json.dumps(record, indent=1))
    print(f"\nevery figure in {args.json}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""The largest GPT that completes 3 training steps on N ranks: ds stage 3, ds stage 2, DDP and FSDP2 in
memory, and ZeRO-Infinity (stage 3 with parameters and optimizer state on disk) under ds and DeepSpeed.

Every implementation climbs the same ladder of GPT sizes (tools/bench/_bench_cases.py's GPT: fixed width,
heads, vocab, sequence and micro batch; the number of layers grows, ``--layers``), with Adam and
gradient clipping, the same config for all (``--dtype`` fp32 or bf16): ds through ``ds_engine.initialize``
(at stage 3 the model is built inside ``ds_engine.zero.Init``), DDP and FSDP2 (``fully_shard`` per block
and at the root) with ``torch.optim.AdamW``; the model and the wrapping are bench_training's, not a copy.
Each rung is a fresh run of ``--world`` processes (gloo, ``--threads`` threads each) that must complete
``--steps`` steps on one batch, with finite losses that fall at every step.

``ds3-nvme`` and ``deepspeed-nvme`` put ``offload_param`` and ``offload_optimizer`` on ``nvme`` under a
folder of ``--nvme-path`` per rung (deleted after the rung), with ``--offload-param``,
``--offload-optimizer``, ``--aio`` and ``--zero`` merged into both configs; the optimizer is the config's
AdamW (each engine's CPU Adam). DeepSpeed 0.19.8 runs in its own venv (``--deepspeed-python``, on its CPU
accelerator, its ops built in ``--torch-extensions-dir``) and builds the model as its docs say for a
model larger than memory, inside ``deepspeed.zero.Init(remote_device="nvme", config_dict_or_path=...)``;
ds builds it inside ``ds_engine.zero.Init`` (which refuses ``remote_device="nvme"``: its partitions stay
in memory until ``initialize`` moves them to the files). Activation checkpointing is each engine's own.

Judged the same way for every implementation: a rung fails when a rank dies out of memory (killed by
SIGKILL, MemoryError, RuntimeError from an allocator), when the sum of the ranks' RSS passes
``--budget-gib`` (a watchdog in this process samples it every 0.2 s, tools/bench/_rank_watchdog.py, and kills
the run and whatever the ranks started, so a failing rung never takes the machine down: there is no
swap), or when the disk fills (No space left on device). The default budget is 22 GiB minus what
everything else holds when the tool starts (printed). An implementation stops climbing at its first
failure (``--bisect``: one more run halfway between its last ok and first failed rung); the largest rung
that completed is its result. Any other error also stops the climb and is shown as an error.

Recorded per rung (printed, and in ``--json``): parameters, ok / fail / error and why, the phase the
ranks had reached (built, wrapped, step k), peak total RSS as sampled and its peak in each phase (model
construction, initialize, each step), per step the slowest rank's time (forward+backward and update
apart), rank 0's losses, and the bytes all ranks read from and wrote to the disk in each part of the step
(``/proc/self/io``: every thread, O_DIRECT and libaio included, so both engines are counted alike); the
swap files' size on disk. ``--fio`` measures the disk's sequential bandwidth first (fio, libaio,
O_DIRECT, 1 MiB requests at queue depth 8 and 32, tools/bench/bench_nvme_io.py's), for the I/O efficiency.

Checking the tool (a few minutes on the shared machine: start-up dominates):

    .venv/bin/python tools/bench/bench_largest_fit.py --world 4 --width 256 --heads 4 --layers 2,4

For the lead, with the machine to itself (after 17:20): width 1600 (GPT-2 XL's), 25 heads, vocab 16000,
seq 128, micro batch 1; 30.7M parameters per layer plus 25.8M of embeddings, so the default ladder of
4, 8, ..., 52 layers is 0.149B, 0.272B, ..., 1.009B (32 layers), ..., 1.624B:

    .venv/bin/python tools/bench/bench_largest_fit.py --world 4 --bisect --json largest_fit.json

Duration, extrapolated from measured rungs at 6 layers = 0.210B, 4 ranks, on the shared machine (load
average ~10, 16:37-16:45 UTC): FSDP2 steps of 60, 45, 33 s, 217 s for the whole rung (start-up,
construction, wrapping, 3 steps), peak total RSS 7.65 GiB; ds stage 3 steps of 40, 44, 14 s, 164 s,
peak total RSS 12.92 GiB. At width 1024, 16 heads, 8 layers = 0.117B (16:50-16:58 UTC, --budget-gib 10):
peak total RSS ds stage 3 8.73 GiB, FSDP2 5.03, ds stage 2 7.27, DDP killed at 10.0. A rung's time grows about linearly with its parameters (the layers dominate
the compute, the construction and Adam): ~1000 s per billion parameters under that load. The default
ladder sums to 11.5B parameters, ~3.3 h for an implementation that climbed all of it; none will: each
stops at its first failure, and at the memory measured above (RSS per parameter roughly constant, not
verified beyond 0.21B) DDP and ds stage 2 stop within the first 2-4 rungs and FSDP2 and ds stage 3 below
~0.9B. Expect 1.5-3 h in all with the machine loaded as it was, perhaps half that with the machine to
itself (not measured). To save time, run the rungs that matter per implementation (each is still judged
the same way), e.g. ``--impls ddp,ds2 --layers 4,8,12,16,20,24`` then ``--impls ds3,fsdp2 --layers
8,12,16,20,24,28,32``.

ZeRO-Infinity (docs/benchmarks.md, "ZeRO-3 with parameters and optimizer state on NVMe"): one
rank with 2 threads, bf16, width 2560 (GPT-3 2.7B's), 20 heads, so 78.7M parameters per layer plus 41.3M
of embeddings (13 layers = 1.064B, 38 layers = 3.031B). DeepSpeed 0.19.8 needs the stage-3 working set
small for its parameter swap buffers (with its defaults it failed at 3 layers, "Not enough buffers 0 for
swapping 1"; with a prefetch of 5e7 elements "param 28 already assigned swap buffer id 1"); both engines
get the same keys. Measured on the shared machine (load average 5-20, ``nice -n 10``): peak total RSS
ds 1.14 / 1.70 / 2.75 GiB at 0.120 / 0.277 / 0.592B (~3.5 bytes per parameter above ~0.8 GiB),
DeepSpeed 3.62 / 5.11 GiB at 0.120 / 0.277B (~10 bytes per parameter above ~2.5 GiB); swap files 14
bytes per parameter for ds, 18 for DeepSpeed; a rung takes ~45 s + ~4.5 min per billion parameters for
ds at 1 rank (start-up, construction and initialize ~75 s per billion, steps ~60 s per billion each),
DeepSpeed ~12 s + ~3.7 min per billion. ``--offload-optimizer``'s buffers and ``sub_group_size`` set
the rest of the fixed memory (DeepSpeed's optimizer swap buffers are ``sub_group_size`` elements each).

    python tools/bench/bench_largest_fit.py --impls ds3-nvme,deepspeed-nvme --world 1 --threads 2 --width 2560 \
      --heads 20 --layers 13 --dtype bf16 --checkpoint-activations --budget-gib 21 --fio \
      --zero '{"sub_group_size": 50000000, "stage3_max_live_parameters": 100000000, \
               "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}' \
      --offload-param '{"max_in_cpu": 0, "buffer_count": 10, "buffer_size": 50000000}'
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parents[1] / "testing")]  # _bench_* modules and rank_testing
from _rank_watchdog import GIB, log_tail, run_watched, used_by_others_bytes  # noqa: E402
from _record import provenance  # noqa: E402
from rank_testing import free_port  # noqa: E402

IMPLS = {  # name -> the case of tools/bench/_bench_cases.py it runs
    "ds3": {"impl": "ds", "stage": 3},
    "ds2": {"impl": "ds", "stage": 2},
    "ddp": {"impl": "ddp", "stage": 0},
    "fsdp2": {"impl": "fsdp2", "stage": 0},
    # ZeRO-Infinity: parameters and optimizer state in files under --nvme-path (one folder per rung)
    "ds3-nvme": {"impl": "ds", "stage": 3, "offload": "nvme"},
    "deepspeed-nvme": {"impl": "deepspeed", "stage": 3, "offload": "nvme"},
}
IN_MEMORY = "ds3,ds2,ddp,fsdp2"
DEFAULT_LAYERS = ",".join(str(n) for n in range(4, 53, 4))
MACHINE_GIB = 22.0


# ------------------------------------------------------------------ one rank (runs in its own process)
def rank_main(spec: dict) -> None:
    """Build, wrap and train ``spec["steps"]`` steps; print PHASE lines as it goes and FIT_RESULT at the end."""
    import torch
    import torch.distributed as dist
    from _bench_cases import BUILDERS, ModelDims, batch, build_model

    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    d = ModelDims(**spec["dims"])
    print(f"PHASE starting @{time.time():.2f}", flush=True)

    def phase(name: str) -> None:  # with the wall clock, to find the watchdog's RSS samples of each phase
        print(f"PHASE {name} @{time.time():.2f}", flush=True)

    model = build_model(spec, d)
    set_checkpointing(model, spec)
    phase("built")
    fwd_bwd, update = BUILDERS[spec["impl"]](model, spec, d)
    phase("wrapped")
    rec: dict[str, list] = {"fwd_bwd_s": [], "update_s": [], "loss": [], "fwd_bwd_io": [], "update_io": []}
    idx, tgt = batch(d, rank, 0)  # the same batch every step: a step that trains makes its loss fall
    tracer = _Tracer(update, spec) if spec.get("trace") and rank == 0 else None
    for i in range(spec["steps"]):
        dist.barrier()  # each step starts together: its time is the step's, not waiting for a slow rank
        if tracer is not None and i == spec["steps"] - 1:
            tracer.start()
        io0, t0 = disk_io(), time.perf_counter()
        loss = fwd_bwd(idx, tgt)
        io1, t1 = disk_io(), time.perf_counter()
        update()
        io2, t2 = disk_io(), time.perf_counter()
        if tracer is not None and i == spec["steps"] - 1:
            tracer.write(t0, t1, t2)
        rec["fwd_bwd_s"].append(t1 - t0)
        rec["update_s"].append(t2 - t1)
        rec["loss"].append(float(loss))
        rec["fwd_bwd_io"].append([b - a for a, b in zip(io0, io1)])
        rec["update_io"].append([b - a for a, b in zip(io1, io2)])
        phase(f"step {i + 1}")
    dist.barrier()
    print("FIT_RESULT " + json.dumps({"rank": rank, **rec}), flush=True)
    dist.destroy_process_group()


class _Tracer:
    """ds with NVMe offload, rank 0: the last step's timeline for tools/bench/plot_nvme_timeline.py: the
    forward+backward and the update intervals, each sub-group's optimizer update, and every request of the
    I/O pool as its worker ran it (``AsyncFileIO.trace``). DeepSpeed's I/O has no such record."""

    def __init__(self, update: Any, spec: dict) -> None:
        optimizer = getattr(getattr(update, "__self__", None), "optimizer", None)
        self.swap, self.aio = getattr(optimizer, "swap", None), getattr(optimizer, "aio", None)
        self.path = spec["trace"]
        if spec["impl"] != "ds" or self.aio is None:
            raise SystemExit("--trace records ds's NVMe offload only (ds3-nvme)")

    def start(self) -> None:
        self.aio.trace = []
        if self.swap is not None:
            self.swap.trace = []

    def write(self, t0: float, t1: float, t2: float) -> None:
        events = [("fwd_bwd", t0, t1, 0), ("step", t1, t2, 0), *(self.swap.trace or []), *self.aio.trace]
        Path(self.path).write_text(json.dumps([(k, a - t1, b - t1, n) for k, a, b, n in events]))


def disk_io() -> tuple[int, int]:
    """(read_bytes, write_bytes) this process has moved to or from storage (/proc/self/io: every thread,
    O_DIRECT and libaio included, the page cache not), so both engines' swaps are counted the same way."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["read_bytes"]), int(fields["write_bytes"])


def set_checkpointing(model: Any, spec: dict) -> None:
    """With ``checkpoint_activations``, every block is recomputed in backward, through each
    implementation's own function: ds_checkpoint.activation's for ds, deepspeed.checkpointing's for
    DeepSpeed (at stage 3 both re-gather the block's weights), torch.utils.checkpoint's (non-reentrant)
    for the others."""
    if not spec.get("checkpoint_activations"):
        return
    if spec["impl"] in ("ds", "deepspeed"):
        module = "ds_checkpoint.activation" if spec["impl"] == "ds" else "deepspeed.checkpointing"
        model.checkpoint = importlib.import_module(module).checkpoint
    else:
        from torch.utils.checkpoint import checkpoint

        model.checkpoint = functools.partial(checkpoint, use_reentrant=False)


# ------------------------------------------------------------------ one rung, watched
def count_params(dims: dict) -> int:
    """Parameters of the GPT at ``dims``, counted on the meta device (nothing is allocated)."""
    import torch
    from _bench_cases import GPT, ModelDims

    with torch.device("meta"):
        return sum(p.numel() for p in GPT(ModelDims(**dims)).parameters())


def _read_rank_lines(logs: Path, world: int) -> tuple[str, list[dict], dict[str, float]]:
    """The furthest phase every rank reached, the records of the ranks that finished, and when rank 0
    entered each phase (wall clock)."""
    phases, results, rank0_at = [], [], {}
    for rank in range(world):
        lines = (logs / f"rank{rank}.out").read_text().splitlines()
        reached = [ln[6:].rsplit(" @", 1) for ln in lines if ln.startswith("PHASE ")]
        phases.append(reached[-1][0] if reached else "starting")
        results += [json.loads(ln[11:]) for ln in lines if ln.startswith("FIT_RESULT ")]
        if rank == 0:
            rank0_at = {name: float(at) for name, at in reached}
    return (
        min(phases, key=_phase_order),
        results,
        rank0_at,
    )  # the rank that got least far says where it failed


def peak_by_phase(samples: list[tuple[float, int]], at: dict[str, float]) -> dict[str, float]:
    """Peak total RSS (GiB) in each of rank 0's phases, a phase named by the line that ends it: "construct"
    (start-up and building the model, up to "built"), "initialize" (up to "wrapped"), "step k", "end"."""
    labels = {"built": "construct", "wrapped": "initialize"}
    ends = sorted((t, labels.get(name, name)) for name, t in at.items() if name != "starting")
    out: dict[str, float] = {}
    begin = 0.0
    for end, label in ends + [(float("inf"), "end")]:
        vals = [b for t, b in samples if begin <= t < end]
        if vals:
            out[label] = max(vals) / GIB
        begin = end
    return out


def _phase_order(phase: str) -> int:
    """starting < built < wrapped < step 1 < step 2 ..."""
    fixed = {"starting": 0, "built": 1, "wrapped": 2}
    return fixed[phase] if phase in fixed else 2 + int(phase.split()[1])


def rung_spec(name: str, layers: int, args: argparse.Namespace) -> dict:
    """What each rank of a rung runs (``rank_main``)."""
    dims = {"vocab": args.vocab, "width": args.width, "layers": layers, "heads": args.heads,
            "seq": args.seq, "micro_batch": args.micro_batch}  # fmt: skip
    spec = {**IMPLS[name], "dtype": args.dtype, "dims": dims, "steps": args.steps, "threads": args.threads,
            "checkpoint_activations": args.checkpoint_activations}  # fmt: skip
    if spec["impl"] in ("ds", "deepspeed"):
        spec["zero"] = json.loads(args.zero)
    if spec.get("offload") == "nvme":
        spec["nvme_path"] = str(Path(args.nvme_path).resolve() / f"{name}-{layers}")
        spec["offload_param"] = json.loads(args.offload_param)
        spec["offload_optimizer"] = json.loads(args.offload_optimizer)
        spec["aio"] = json.loads(args.aio)
    if args.trace and name == "ds3-nvme":
        spec["trace"] = str(Path(args.trace).resolve())
    return spec


def disk_usage_bytes(folder: Path) -> int:
    """Bytes the files under ``folder`` occupy on the disk (allocated blocks, as ``du``)."""
    return sum(os.stat(Path(root) / f).st_blocks * 512 for root, _, files in os.walk(folder) for f in files)


def run_rung(name: str, layers: int, args: argparse.Namespace, budget_bytes: int) -> dict:
    """One fresh ``--world``-process run of implementation ``name`` with ``layers`` layers."""
    spec = rung_spec(name, layers, args)
    env = dict(os.environ, WORLD_SIZE=str(args.world), LOCAL_WORLD_SIZE=str(args.world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS=str(args.threads))  # fmt: skip
    python = sys.executable
    if spec["impl"] == "deepspeed":  # DeepSpeed 0.19.8 in its own venv, on its CPU accelerator
        python = args.deepspeed_python
        env.pop("PYTHONPATH", None)
        env["DS_ACCELERATOR"] = "cpu"
        env["TORCH_EXTENSIONS_DIR"] = args.torch_extensions_dir  # its ops: never rebuilt in a shared cache
    cmd = [python, str(Path(__file__).resolve()), "--rank", json.dumps(spec)]
    swap = Path(spec["nvme_path"]) if "nvme_path" in spec else None
    if swap is not None:
        shutil.rmtree(swap, ignore_errors=True)
        swap.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory(prefix=f"fit-{name}-{layers}-") as tmp:
            outcome, oom = run_watched([cmd] * args.world, env, Path(tmp), budget_bytes, args.rung_timeout_s)
            phase, results, at = _read_rank_lines(Path(tmp), args.world)
            # a rank that failed by itself (not killed by SIGKILL): its traceback, for the lead to read in --json
            tracebacks = {r: log_tail(Path(tmp) / f"rank{r}.err", 2000)
                          for r, code in enumerate(outcome.returncodes) if code not in (0, -9)}  # fmt: skip
        disk = disk_usage_bytes(swap) if swap is not None else 0  # the swap files as the run left them
    finally:  # the swap files are scratch: never leave tens of GB behind
        if swap is not None:
            shutil.rmtree(swap, ignore_errors=True)
    status = "ok" if outcome.ok else ("fail" if oom else "error")
    reason = outcome.reason
    if any("No space left on device" in t for t in tracebacks.values()):
        status, reason = "fail", "disk full (No space left on device): " + reason
    rec = judge_steps(results, args.world)
    if status == "ok" and not rec["loss_falls"]:
        status, reason = "error", f"losses {rec['loss']}: not finite and falling"
    return {"impl": name, "layers": layers, "params": count_params(spec["dims"]), "status": status,
            "reason": reason, "phase": phase, "peak_total_rss_gib": outcome.peak_total_rss_bytes / GIB,
            "peak_rss_gib_by_phase": peak_by_phase(outcome.samples, at), "swap_disk_gib": disk / GIB,
            **rec, "wall_s": outcome.wall_s, "returncodes": outcome.returncodes,
            "tracebacks": tracebacks}  # fmt: skip


def judge_steps(results: list[dict], world: int) -> dict:
    """Per step over the ranks that finished: the slowest rank's times, the bytes all ranks moved to and
    from the disk, rank 0's losses (and whether they are finite and fall at every step)."""
    if len(results) != world:
        return {"step_s": [], "fwd_bwd_s": [], "update_s": [], "loss": [], "loss_falls": False, "io_gb": []}
    results.sort(key=lambda r: r["rank"])
    slowest = {k: [max(s) for s in zip(*(r[k] for r in results))] for k in ("fwd_bwd_s", "update_s")}
    n = len(results[0]["loss"])
    step_s = [max(r["fwd_bwd_s"][i] + r["update_s"][i] for r in results) for i in range(n)]
    loss = results[0]["loss"]
    falls = all(math.isfinite(x) for x in loss) and all(b < a for a, b in zip(loss, loss[1:]))
    io_gb = [  # per step: fwd+bwd read, written; update read, written (GB, all ranks)
        [sum(r[phase][i][k] for r in results) / 1e9 for phase in ("fwd_bwd_io", "update_io") for k in (0, 1)]
        for i in range(n)
    ]
    return {"step_s": step_s, **slowest, "loss": loss, "loss_falls": falls, "io_gb": io_gb}


def rung_line(r: dict) -> str:
    def nums(xs: list[float], fmt: str = ".2f") -> str:
        return "[" + (", ".join(f"{x:{fmt}}" for x in xs) or "-") + "]"

    why = f" ({r['reason']}; reached {r['phase']})" if r["status"] != "ok" else ""
    line = (f"{r['impl']:>5} {r['layers']:>3} layers {r['params'] / 1e9:6.3f}B: {r['status']}{why}; "
            f"peak total RSS {r['peak_total_rss_gib']:.2f} GiB; step s {nums(r['step_s'])} "
            f"(update {nums(r['update_s'])}); loss {nums(r['loss'], '.4f')}; wall {r['wall_s']:.0f} s\n"
            "      peak RSS GiB by phase: " + ", ".join(f"{k} {v:.2f}" for k, v in r["peak_rss_gib_by_phase"].items()))  # fmt: skip
    if IMPLS[r["impl"]].get("offload") == "nvme":
        line += (f"\n      swap files {r['swap_disk_gib']:.2f} GiB; disk GB per step (fwd+bwd read, written; "
                 f"update read, written): " + "; ".join(nums(x) for x in r["io_gb"]))  # fmt: skip
    return line


def climb(
    name: str, ladder: list[int], args: argparse.Namespace, budget_bytes: int, report: dict
) -> list[dict]:
    """Run the ladder up to the first rung that does not complete (then bisect once if asked); every rung
    is added to ``report["rungs"]`` and written to ``--json`` as it ends (an interrupted search keeps it)."""
    rungs: list[dict] = []

    def run(layers: int, note: str = "") -> None:
        rungs.append(run_rung(name, layers, args, budget_bytes))
        report["rungs"].append(rungs[-1])
        print(rung_line(rungs[-1]) + note, flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))

    for layers in ladder:
        run(layers)
        if rungs[-1]["status"] != "ok":
            break
    ok = [r["layers"] for r in rungs if r["status"] == "ok"]
    failed = rungs[-1]["layers"] if rungs and rungs[-1]["status"] == "fail" else None
    if args.bisect and ok and failed is not None and failed - ok[-1] > 1:
        run((ok[-1] + failed) // 2, "  (bisect)")
    return rungs


def disk_report(folder: Path, fio: bool) -> dict:
    """Free space under ``folder`` (and with ``fio`` its sequential bandwidth, tools/bench/bench_nvme_io.py's
    measurement), printed and returned for the report."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {"free_gb": shutil.disk_usage(folder).free / 1e9}
    if fio:
        from bench_nvme_io import bench_fio

        out.update(
            {
                f"fio_qd{q}_{k}": v
                for q in (8, 32)
                for k, v in bench_fio(str(folder / "fio.bin"), 1024, q).items()
            }
        )
    print("disk under " + str(folder) + ": " + ", ".join(f"{k} {v:.0f}" for k, v in out.items()), flush=True)
    return out


def largest(rungs: list[dict]) -> dict | None:
    ok = [r for r in rungs if r["status"] == "ok"]
    return max(ok, key=lambda r: r["layers"]) if ok else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--impls", default=IN_MEMORY, help="comma-separated, from " + ",".join(IMPLS))
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layers", default=DEFAULT_LAYERS, help="the ladder, e.g. 4,8,12 (increasing)")
    parser.add_argument("--impl-layers", default="{}",
                        help='JSON: another ladder for some implementations, e.g. \'{"deepspeed-nvme": "13,19"}\'')  # fmt: skip
    parser.add_argument("--width", type=int, default=1600)
    parser.add_argument("--heads", type=int, default=25)
    parser.add_argument("--vocab", type=int, default=16_000)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--threads", type=int, default=1, help="torch (and OpenMP) threads per rank")
    parser.add_argument("--nvme-path", default=os.path.join(tempfile.gettempdir(), "ds-bench-nvme"),
                        help="*-nvme: each rung's swap files go to a folder here, deleted after the rung")  # fmt: skip
    parser.add_argument("--offload-param", default="{}", help="*-nvme: JSON merged into offload_param")
    parser.add_argument(
        "--offload-optimizer", default="{}", help="*-nvme: JSON merged into offload_optimizer"
    )
    parser.add_argument("--aio", default="{}", help="*-nvme: the aio section (JSON)")
    parser.add_argument("--fio", action="store_true",
                        help="first measure the disk under --nvme-path with fio (1 GiB, 1 MiB O_DIRECT requests)")  # fmt: skip
    parser.add_argument(
        "--deepspeed-python",
        default=os.environ.get("DS_DEEPSPEED_PYTHON"),
        help="deepspeed-*: a python with deepspeed==0.19.8 (default: $DS_DEEPSPEED_PYTHON)",
    )
    parser.add_argument("--torch-extensions-dir", default="/tmp/tx_largest",
                        help="deepspeed-*: where its ops (CPU Adam, async I/O) are built and loaded from; build "
                        "them there once before a run, or the first rung's time includes the build")  # fmt: skip
    parser.add_argument("--budget-gib", type=float, help=f"default: {MACHINE_GIB} GiB minus what others use")
    parser.add_argument("--bisect", action="store_true", help="one extra run between last ok and first fail")
    parser.add_argument("--rung-timeout-s", type=float, default=3600)
    parser.add_argument("--json", help="write every rung and the result here")
    parser.add_argument("--trace", help="ds3-nvme: rank 0's last step as a timeline (JSON, for "
                        "tools/bench/plot_nvme_timeline.py); with several rungs, the last one's")  # fmt: skip
    parser.add_argument(
        "--zero",
        default="{}",
        help="JSON merged into ds's and DeepSpeed's zero_optimization, e.g. the stage-3 working-set keys DeepSpeed's docs "
        "tell users to lower when a model does not fit (defaults: DeepSpeed's, which keep up to 1e9 "
        "parameters gathered and reduce in buckets of 5e8 elements)",
    )
    parser.add_argument(
        "--checkpoint-activations",
        action="store_true",
        help="every implementation recomputes each block in backward (ds: ds_checkpoint.activation."
        "checkpoint, DeepSpeed: deepspeed.checkpointing.checkpoint, both re-gather stage 3's weights; "
        "others: torch.utils.checkpoint)",
    )
    parser.add_argument("--rank", help=argparse.SUPPRESS)  # internal: run one rank in this interpreter
    args = parser.parse_args()
    if args.rank:
        rank_main(json.loads(args.rank))
        return
    # SIGTERM (timeout, a killed job) unwinds like Ctrl-C, so the watchdog's finally kills the ranks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{Path(__file__).name}: terminated"))
    impls = args.impls.split(",")
    ladders = {name: [int(x) for x in json.loads(args.impl_layers).get(name, args.layers).split(",") if x]
               for name in impls}  # fmt: skip
    unknown = [i for i in impls if i not in IMPLS]
    if unknown or any(lad != sorted(set(lad)) or not lad for lad in ladders.values()):
        parser.error(f"--impls takes {','.join(IMPLS)} (got {unknown}); --layers an increasing list")
    others = used_by_others_bytes()
    budget = args.budget_gib * GIB if args.budget_gib else MACHINE_GIB * GIB - others
    print(f"command: {shlex.join([os.path.relpath(sys.executable)] + sys.argv)}")
    print(f"memory in use by everything else at start: {others / GIB:.2f} GiB; "
          f"budget for the ranks' total RSS: {budget / GIB:.2f} GiB"
          + ("" if args.budget_gib else f" ({MACHINE_GIB} GiB - that)"))  # fmt: skip
    rungs_dims = {"vocab": args.vocab, "width": args.width, "heads": args.heads, "seq": args.seq,
                  "micro_batch": args.micro_batch}  # fmt: skip
    for name in impls:
        print(f"ladder of {name}: " + ", ".join(f"{n} layers = {count_params({**rungs_dims, 'layers': n}) / 1e9:.3f}B"
                                                for n in ladders[name]), flush=True)  # fmt: skip
    report: dict = {**provenance(), "settings": vars(args), "budget_gib": budget / GIB, "others_gib": others / GIB,
                    "rungs": [], "largest": {}}  # fmt: skip
    if any(IMPLS[name].get("offload") == "nvme" for name in impls):
        report["disk"] = disk_report(Path(args.nvme_path), args.fio)
    for name in impls:
        rungs = climb(name, ladders[name], args, int(budget), report)
        best = largest(rungs)
        report["largest"][name] = best and {k: best[k] for k in ("layers", "params", "peak_total_rss_gib")}
        if args.json:  # after every implementation: an interrupted search keeps what it found
            Path(args.json).write_text(json.dumps(report, indent=1))
    print(
        f"\n| impl | largest that completed {args.steps} steps | params | peak total RSS GiB | first failure |"
    )
    print("|---|---|---|---|---|")
    for name in impls:
        best = report["largest"][name]
        fails = [r for r in report["rungs"] if r["impl"] == name and r["status"] != "ok"]
        first = f"{fails[0]['layers']} layers: {fails[0]['reason']}" if fails else "none in the ladder"
        size = (
            f"{best['layers']} layers | {best['params'] / 1e9:.3f}B | {best['peak_total_rss_gib']:.2f}"
            if best
            else "none | - | -"
        )
        print(f"| {name} | {size} | {first} |")


if __name__ == "__main__":
    main()

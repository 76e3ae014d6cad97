"""Stage 3 with the parameters in CPU memory against on disk (offload_param cpu vs nvme), side by side.

One process (gloo, world 1), a stack of square Linear layers, both offloads on the same device kind each
run (cpu/cpu, then nvme/nvme with max_in_cpu 0), AdamW. Prints per run: the median step time (forward +
backward + step) over the steps after the first (with ``--repeats``, the median of the runs' medians), the
bytes the swap files took in and gave per step (parameters and optimizer state, and the gradients where
they are in files too), the peak RSS of the run (each run is its own process), the largest RSS seen after
a backward and after a step (the training state alone: the peak RSS can be set by building the model), and
whether the losses are equal. ``nvme-syncw`` is the nvme run with the step's weight writes waited for one
by one (as before they were left in flight while the next sub-groups step: ``ParamSwap.write_range``
forced to ``wait=True`` in that child), the before/after of the asynchronous writes in one run.

    python tools/bench/bench_param_nvme.py --layers 8 --width 2048 --steps 4 --nvme-path /var/tmp/ds-nvme
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from ds_zero import ZeroStage3Optimizer
from ds_zero.stage3 import Stage3Options
from ds_zero.stage3._options import NvmeOptions, ParamNvmeOptions
from torch import nn


def run(options: Stage3Options, layers: int, width: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    zero = ZeroStage3Optimizer(model, torch.optim.AdamW(model.parameters(), lr=1e-4), options)
    times, losses = [], []
    io = zero.aio.stats if zero.aio is not None else None
    before = (io.bytes_read, io.bytes_written) if io else (0, 0)
    page = os.sysconf("SC_PAGE_SIZE")
    rss: dict[str, list[int]] = {"backward": [], "step": []}  # resident bytes after each backward / step

    def sample(when: str) -> None:
        with open("/proc/self/statm") as f:
            rss[when].append(int(f.read().split()[1]) * page)

    for step in range(steps):
        x = torch.randn(8, width, generator=torch.Generator().manual_seed(step))
        t0 = time.perf_counter()
        loss = model(x).pow(2).mean()
        zero.backward(loss)
        sample("backward")
        zero.step()
        times.append(time.perf_counter() - t0)
        sample("step")
        losses.append(loss.item())
    moved = ((io.bytes_read - before[0]) / steps, (io.bytes_written - before[1]) / steps) if io else (0, 0)
    return {
        "step_s": statistics.median(times[1:]) if steps > 1 else times[0],
        "read_mb_per_step": moved[0] / 1e6,
        "written_mb_per_step": moved[1] / 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "backward_rss_mb": max(rss["backward"]) / 2**20,
        "step_rss_mb": max(rss["step"]) / 2**20,
        "losses": losses,
    }


NAMES = ("cpu", "nvme", "nvme-syncw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--nvme-path", default=None, help="a directory on the disk to measure (default: a temp dir)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each, alternating; the median is printed"
    )
    parser.add_argument("--only", choices=NAMES, help=argparse.SUPPRESS)  # one run, in a child
    args = parser.parse_args()
    if args.only is None:  # each run in its own process, so each peak RSS is its own
        results: dict[str, dict] = {}
        for _ in range(args.repeats):  # the runs alternate, so a change in the machine's load hits each alike
            for name in NAMES:
                out = subprocess.run(
                    [sys.executable, *sys.argv, "--only", name], capture_output=True, text=True
                )
                if out.returncode:
                    raise SystemExit(out.stderr)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                results.setdefault(name, {**r, "all_step_s": []})["all_step_s"].append(r["step_s"])
        print(results["cpu"]["header"])
        for name, r in results.items():
            r["step_s"] = statistics.median(r["all_step_s"])
            each = " ".join(f"{t:.2f}" for t in r["all_step_s"])
            print(f"{name:10s} step {r['step_s']:.3f} s (runs: {each})  read {r['read_mb_per_step']:.0f} MB/step  "
                  f"written {r['written_mb_per_step']:.0f} MB/step  peak RSS {r['peak_rss_mb']:.0f} MB  "
                  f"RSS after backward {r['backward_rss_mb']:.0f} MB, after step {r['step_rss_mb']:.0f} MB")  # fmt: skip
        print("losses equal:", all(r["losses"] == results["cpu"]["losses"] for r in results.values()))
        return
    with socket.socket() as sock:  # a free port: other runs on the machine may hold any fixed one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    base = Stage3Options(param_persistence_threshold=0, sub_group_size=args.width * args.width)
    path = args.nvme_path or tempfile.mkdtemp(prefix="ds-bench-nvme-")
    os.makedirs(path, exist_ok=True)
    params = args.layers * (args.width * args.width + args.width)
    header = f"{args.layers} x Linear({args.width}, {args.width}): {params / 1e6:.1f}M parameters, nvme_path {path}"
    runs = {
        "cpu": dataclasses.replace(base, offload_param=True, offload_optimizer=True),
        "nvme": dataclasses.replace(
            base,
            param_nvme=ParamNvmeOptions(
                path, buffer_count=4, buffer_size=args.width * args.width, max_in_cpu=0
            ),
            optimizer_nvme=NvmeOptions(path, buffer_count=2, pipeline_read=True, pipeline_write=True),
        ),
    }
    if args.only == "nvme-syncw":  # the synchronous weight writes of before (the baseline)
        from ds_zero.stage3._param_swap import ParamSwap

        write_range = ParamSwap.write_range
        ParamSwap.write_range = lambda self, *a, wait=True: write_range(self, *a, wait=True)
    result = run(runs[args.only.split("-")[0]], args.layers, args.width, args.steps)
    dist.destroy_process_group()
    print(json.dumps({**result, "header": header}))


if __name__ == "__main__":
    main()

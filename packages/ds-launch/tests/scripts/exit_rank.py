"""A rank that never calls destroy_process_group: how does it leave?

Usage: exit_rank.py OUT MODE, run with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set. An atexit handler
registered before init_distributed runs after init_distributed's own (atexit is last in, first out)
and records whether the process group was still initialised at that point, in OUT/exit{RANK}.txt.
MODE "clean" returns normally right after a collective; "theirs" does too, in a process group torch
created before init_distributed (as Accelerate and the Trainer do), and records nothing; "raise" leaves an all-reduce in flight and
raises (rank 0 only; rank 1 waits, as a healthy peer would, until the file OUT/release exists); "busy"
returns with a thread of its own still running for 0.8 s, which writes OUT/busy{RANK}.txt when it ends.
"inflight" and "inflight-theirs" (the latter in a group torch created, as "theirs") return with an
all-reduce launched and never waited for, on the subgroup the script still holds, whose tensor the script
dropped: rank 0 joins it only 1.5 s later, so rank 1's gloo worker finishes it, and frees the tensor,
while rank 1 is already leaving. "dropped" and "dropped-theirs" do the same without the delay and drop the
subgroup: OUT/workers{RANK}.txt then says how many gloo worker threads are left when record() runs.
"""

import atexit
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from ds_launch import init_distributed
from ds_launch._distributed import gloo_workers

out, mode = Path(sys.argv[1]), sys.argv[2]


def record() -> None:
    (out / f"exit{topo.rank}.txt").write_text("initialised" if dist.is_initialized() else "destroyed")
    (out / f"workers{topo.rank}.txt").write_text(str(gloo_workers()))  # gloo threads left for finalization


if mode.endswith("theirs"):
    dist.init_process_group("gloo")
if mode in ("theirs", "inflight-theirs"):
    pass  # no record(): its file write lets go of the GIL at exit
else:
    atexit.register(record)
topo = init_distributed(backend="gloo")
group = dist.new_group(list(range(topo.world_size)))  # a subgroup too: teardown must cover it
dist.all_reduce(torch.ones(4), group=group)
dist.all_reduce(torch.ones(4))  # the last collective's tensor dies as the call returns
if mode == "theirs":  # a metrics gather per step, as a Trainer does: each tensor dies as the call returns
    for _ in range(20):
        dist.all_reduce(torch.ones(1000))
        dist.all_reduce(torch.ones(10), async_op=True).wait()
if mode.startswith("inflight"):
    if topo.rank == 0:
        time.sleep(1.5)
    dist.all_reduce(torch.ones(1 << 16), group=group, async_op=True)  # the tensor and the Work dropped
if mode.startswith("dropped"):  # the script keeps no group: teardown must join every worker thread
    dist.all_reduce(torch.ones(1 << 16), group=group, async_op=True)
    del group
if mode == "busy":  # a thread still running at exit, like a gloo worker the scheduler has not run yet

    def busy() -> None:
        end = time.monotonic() + 0.8
        while time.monotonic() < end:
            pass
        (out / f"busy{topo.rank}.txt").write_text("finished")

    threading.Thread(target=busy, daemon=True).start()
if mode == "raise":
    if topo.rank == 0:
        dist.all_reduce(torch.ones(1 << 16), async_op=True)  # rank 1 never joins this one
        raise RuntimeError("rank 0 failed with a collective in flight")
    deadline = time.monotonic() + 120
    while not (out / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.05)

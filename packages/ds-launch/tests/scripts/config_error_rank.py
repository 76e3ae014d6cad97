"""A rank whose DeepSpeed config has a batch-size error (or, with MODE "bug", a bug of its own).

Usage: config_error_rank.py MODE. MODE "config-rank0-late": rank 0 loads it 3 s after the others (under
mpirun and torchrun, which kill the other ranks when one fails, rank 0 must still print it in full). Every rank loads the same inconsistent config with ds_config after
init_distributed, as ds_engine.initialize does. Under ds-launch no rank exits before every rank has
recorded its end, so that the launcher stops none before it raised (the job's output is then the same
on every run).
"""

import atexit
import os
import sys
import time
from pathlib import Path

from ds_config import load_config
from ds_launch import init_distributed

topo = init_distributed(backend="gloo")
events = os.environ.get("DS_LAUNCH_EVENTS_DIR")


def wait_for_every_record() -> None:
    """At exit, after this rank's record (registered after init_distributed's exit: it runs first)."""
    deadline = time.monotonic() + 60
    paths = [Path(events) / f"rank{r}.json" for r in range(topo.world_size)]
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)


if events:
    atexit.register(wait_for_every_record)
if sys.argv[1] == "bug":
    raise RuntimeError(f"a bug on rank {topo.rank}")
if sys.argv[1] == "config-rank0-late" and topo.rank == 0:
    time.sleep(3)
load_config(
    {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1},
    world_size=topo.world_size,
)
